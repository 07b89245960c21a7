"""Rotations for TurboQuant keys. Convention, used everywhere here:

the ``rotation`` argument R is a float32 ``[D, D]`` orthogonal matrix applied to ROW vectors:
a unit key is stored as ``y = x_hat @ R`` and the query is rotated the same way,
``q_rot = q @ R``, so ``<q_rot, y> = <q, x_hat>``. R is vLLM's ``PiT``. The original-space key is
``y @ R.T``. With the (symmetric) Hadamard, R = R.T; the random rotation is not symmetric, so
rotating with ``R.T`` instead of ``R`` is a visible bug.

Head sizes that are not a power of two (D = 80, 96, 112, ...: Phi-class models). The reference
defines TurboQuant there with a seeded Haar-random orthogonal rotation of size D (``random_rotation``;
``default_rotation`` picks it), NOT by padding to the next power of two:

- the TurboQuant paper (Zandieh et al., arXiv 2504.19874) rotates by a random orthogonal matrix (QR of a
  Gaussian one), defined for every D, and its Lloyd-Max codebook is solved for N(0, 1/D) at that D;
- vLLM's cache layout is D-wide (``TurboQuantConfig.key_packed_size`` is ``ceil(D * bits / 8)`` + 2, the
  kernels mask ``tl.arange(0, next_power_of_2(D))`` to D), so a padded rotation would not fit its slots;
- vLLM 0.32.0's serving rotation (``_build_hadamard_cached`` in
  ``vllm/v1/attention/backends/turboquant_attn.py``) doubles a Sylvester matrix until it is at least
  D wide and divides by sqrt(D): for D = 96 a 128 x 128 matrix, neither D x D nor orthogonal (vLLM issue
  #41413); the proposed fixes pad (PR #41414, a larger cache) or slice ``H[:D, :D]`` (PR #41597, not
  orthogonal). So vLLM defines no rotation at such D and the reference does not copy one.

A Sylvester Hadamard needs a power of two: ``hadamard`` refuses any other D, and ``check_rotation``
refuses a matrix that is not orthogonal (the identity ``<q_rot, y> = <q, x_hat>`` fails without it).
"""
from __future__ import annotations

import numpy as np

from reference.turboquant.presets import check_head_size

# vLLM's ``TurboQuantConfig.seed`` (42), the seed of the random rotation its earlier versions used
DEFAULT_SEED = 42
U32 = 2.0**-24


def orthogonality_atol(D: int) -> float:
    """Bound on the entries of ``R R^T - I`` (float64) of an orthogonal matrix held in float32: rounding
    each entry (u32 relative) moves ``(R R^T)_ij`` by at most 2 u32 (Cauchy-Schwarz over unit rows); a
    rotation computed in float32 adds lambda sqrt(D) u32 (lambda = 8, a length-D dot product's
    probabilistic bound of Higham and Mary 2019)."""
    return (2.0 + 8.0 * np.sqrt(D)) * U32


def is_power_of_two(D: int) -> bool:
    """Whether the head size ``D`` (an int) is a power of two (a Sylvester Hadamard exists)."""
    return D > 0 and not D & (D - 1)


def hadamard(D: int) -> np.ndarray:
    """Normalised Sylvester Hadamard ``H_D / sqrt(D)``, float32, symmetric; D a power of two
    (ValueError otherwise, naming ``random_rotation`` as what the reference uses there)."""
    D = check_head_size(D)
    if not is_power_of_two(D):
        raise ValueError(f"D must be a power of two for the Sylvester Hadamard, got {D}; TurboQuant at this "
                         "head size uses the seeded random rotation (random_rotation, default_rotation)")
    h = np.ones((1, 1))
    while h.shape[0] < D:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(D)).astype(np.float32)


def random_rotation(D: int, seed: int) -> np.ndarray:
    """Haar-random orthogonal float32 ``[D, D]``: QR of a seeded Gaussian matrix, columns signed
    by ``sign(diag(R))`` (zero counts as +1). Not symmetric. Any D that ``check_head_size`` takes."""
    D = check_head_size(D)
    g = np.random.default_rng(seed).standard_normal((D, D))
    q, r = np.linalg.qr(g)
    signs = np.where(np.diag(r) < 0, -1.0, 1.0)
    return (q * signs).astype(np.float32)


def default_rotation(D: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """The rotation TurboQuant uses at head size D: vLLM's Hadamard when D is a power of two, else the
    seeded random rotation (module docstring: the choice and its sources)."""
    D = check_head_size(D)
    return hadamard(D) if is_power_of_two(D) else random_rotation(D, seed)


def check_rotation(rotation, D: int) -> None:
    """ValueError unless ``rotation`` is a finite ``[D, D]`` float array, orthogonal to within
    ``orthogonality_atol(D)`` (every entry of ``R R^T - I``, computed in float64)."""
    shape = tuple(getattr(rotation, "shape", ()))
    if shape != (D, D):
        raise ValueError(f"rotation must have shape [{D}, {D}], got {list(shape)}")
    if np.dtype(rotation.dtype).kind != "f":
        raise ValueError(f"rotation must be a float array, got dtype {rotation.dtype}")
    r = np.asarray(rotation, dtype=np.float64)
    if not np.all(np.isfinite(r)):
        raise ValueError("rotation holds NaN or Inf")
    off, atol = float(np.abs(r @ r.T - np.eye(D)).max()), orthogonality_atol(D)
    if not off <= atol:
        raise ValueError(f"rotation must be orthogonal (R R^T = I to within {atol:.2g}), but an "
                         f"entry of R R^T - I is {off:.3g}")
