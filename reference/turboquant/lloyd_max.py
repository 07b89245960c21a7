"""Lloyd-Max scalar quantizer for N(0, 1/D), solved here.

The same algorithm as vLLM's ``solve_lloyd_max``: sigma = 1/sqrt(D); start with 2^bits centroids
uniform on [-3.5 sigma, 3.5 sigma]; cell boundaries are midpoints of adjacent centroids, outer edges
+-10.5 sigma; each new centroid is the conditional mean of the Gaussian over its cell, integrated
with the trapezoid rule on 200 points per cell (float64); stop when no centroid moves by 1e-10 or
after 200 iterations. The result is float32, sorted; the store bucketizes against the float32
midpoints of adjacent centroids.
"""
from __future__ import annotations

import functools

import numpy as np

from reference.turboquant.presets import check_head_size

TRAPEZOID_POINTS = 200
MAX_ITER = 200
TOL = 1e-10


def _trapezoid_cell_means(edges: np.ndarray, sigma: float) -> np.ndarray:
    """Conditional mean of N(0, sigma^2) over each cell [edges[i], edges[i+1]] (trapezoid rule)."""
    t = np.linspace(0.0, 1.0, TRAPEZOID_POINTS)
    x = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * t  # [L, n]
    pdf = np.exp(-0.5 * (x / sigma) ** 2) / (sigma * np.sqrt(2.0 * np.pi))
    mass = np.trapezoid(pdf, x, axis=1)
    first = np.trapezoid(x * pdf, x, axis=1)
    return first / mass


@functools.lru_cache(maxsize=None)
def _solve(bits: int, D: int) -> np.ndarray:
    sigma = 1.0 / np.sqrt(D)
    levels = 2**bits
    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = lo + (hi - lo) * (np.arange(levels) + 0.5) / levels
    for _ in range(MAX_ITER):
        edges = np.concatenate([[3.0 * lo], (c[:-1] + c[1:]) / 2.0, [3.0 * hi]])
        new = _trapezoid_cell_means(edges, sigma)
        moved = np.max(np.abs(new - c))
        c = new
        if moved < TOL:
            break
    out = np.sort(c).astype(np.float32)
    out.setflags(write=False)
    return out


def centroids(bits: int, D: int) -> np.ndarray:
    """float32 ``[2**bits]`` Lloyd-Max centroids for one coordinate of a rotated unit vector."""
    if bits not in (1, 2, 3, 4):
        raise ValueError(f"bits must be 1, 2, 3 or 4, got {bits!r}")
    return _solve(int(bits), check_head_size(D)).copy()


def midpoints(c: np.ndarray) -> np.ndarray:
    """float32 decision boundaries between sorted centroids: ``(c[:-1] + c[1:]) / 2`` in float32.
    ValueError naming ``centroids`` unless ``c`` is a finite, strictly increasing 1-d table."""
    c = np.asarray(c, dtype=np.float32)
    if c.ndim != 1 or c.size < 2:
        raise ValueError(f"centroids must be a 1-d table of at least 2 entries, got shape {list(c.shape)}")
    if not np.all(np.isfinite(c)):
        raise ValueError("centroids holds NaN or Inf")
    if np.any(np.diff(c) <= 0):
        raise ValueError("centroids must be strictly increasing")
    return ((c[:-1] + c[1:]) / np.float32(2)).astype(np.float32)


def gaussian_mse(bits: int, D: int) -> float:
    """``D * E[(x - q(x))^2]`` for x ~ N(0, 1/D): the distortion per unit vector (paper: 0.36,
    0.117, 0.03, 0.009 for 1..4 bits), by the same trapezoid rule over the quantizer's cells."""
    c = centroids(bits, D).astype(np.float64)
    sigma = 1.0 / np.sqrt(D)
    edges = np.concatenate([[-10.5 * sigma], (c[:-1] + c[1:]) / 2.0, [10.5 * sigma]])
    t = np.linspace(0.0, 1.0, 4 * TRAPEZOID_POINTS)
    x = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * t
    pdf = np.exp(-0.5 * (x / sigma) ** 2) / (sigma * np.sqrt(2.0 * np.pi))
    return float(D * np.sum(np.trapezoid((x - c[:, None]) ** 2 * pdf, x, axis=1)))
