"""Rotations for TurboQuant keys. Convention, used everywhere here:

the ``rotation`` argument R is a float32 ``[D, D]`` orthogonal matrix applied to ROW vectors:
a unit key is stored as ``y = x_hat @ R`` and the query is rotated the same way,
``q_rot = q @ R``, so ``<q_rot, y> = <q, x_hat>``. R is vLLM's ``PiT``. The original-space key is
``y @ R.T``. With the (symmetric) Hadamard, R = R.T; the random rotation is not symmetric, so
rotating with ``R.T`` instead of ``R`` is a visible bug.
"""
from __future__ import annotations

import numpy as np

from reference.turboquant.presets import check_head_size


def hadamard(D: int) -> np.ndarray:
    """Normalised Sylvester Hadamard ``H_D / sqrt(D)``, float32, symmetric; D a power of two."""
    D = check_head_size(D)
    if D & (D - 1):
        raise ValueError(f"D must be a power of two for the Sylvester Hadamard, got {D}")
    h = np.ones((1, 1))
    while h.shape[0] < D:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(D)).astype(np.float32)


def random_rotation(D: int, seed: int) -> np.ndarray:
    """Haar-random orthogonal float32 ``[D, D]``: QR of a seeded Gaussian matrix, columns signed
    by ``sign(diag(R))`` (zero counts as +1). Not symmetric."""
    D = check_head_size(D)
    g = np.random.default_rng(seed).standard_normal((D, D))
    q, r = np.linalg.qr(g)
    signs = np.where(np.diag(r) < 0, -1.0, 1.0)
    return (q * signs).astype(np.float32)


def check_rotation(rotation, D: int) -> None:
    """ValueError unless ``rotation`` is a finite ``[D, D]`` float array."""
    shape = tuple(getattr(rotation, "shape", ()))
    if shape != (D, D):
        raise ValueError(f"rotation must have shape [{D}, {D}], got {list(shape)}")
    if np.dtype(rotation.dtype).kind != "f":
        raise ValueError(f"rotation must be a float array, got dtype {rotation.dtype}")
    if not np.all(np.isfinite(np.asarray(rotation, dtype=np.float32))):
        raise ValueError("rotation holds NaN or Inf")
