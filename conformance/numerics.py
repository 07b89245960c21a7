"""Floating-point facts the lab's tolerances are built from, one definition each.

Unit roundoffs (half an ulp at 1, round to nearest): ``U32`` (float32), ``UBF16`` (bfloat16),
``UFP16`` (float16), ``U64`` (float64), and ``UNIT`` by dtype name. Round trips return float32 arrays that hold the
nearest (round-to-nearest-even) value of the narrow type. Metrics take any real arrays and work
in float64.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

U64 = 2.0 ** -53
U32 = 2.0 ** -24
UBF16 = 2.0 ** -8
UFP16 = 2.0 ** -11
UNIT = {"float64": U64, "float32": U32, "bfloat16": UBF16, "float16": UFP16}


def bf16_round(x) -> np.ndarray:
    """float32 array holding the nearest bfloat16 values of ``x`` (RNE)."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def fp16_round(x) -> np.ndarray:
    """float32 array holding the nearest float16 values of ``x`` (RNE; beyond 65504 -> Inf)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def fp16_ordinal(x) -> np.ndarray:
    """float16 bit patterns of ``x`` as int64 in value order: adjacent float16 values differ by 1."""
    bits = np.asarray(x, dtype=np.float16).view(np.int16).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


def rel_l2(actual, expected) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (the absolute norm when expected is 0).
    Non-finite differences are left out of the norm (``compare`` counts them separately)."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    diff = np.abs(a - e)
    d_norm = float(np.linalg.norm(np.where(np.isfinite(diff), diff, 0.0)))
    e_norm = float(np.linalg.norm(e))
    return d_norm / e_norm if e_norm else d_norm


def cosine(actual, expected) -> float:
    """Cosine similarity over the finite elements, float64; 1 when both are 0, 0 when one is."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    a_norm = float(np.linalg.norm(np.where(np.isfinite(a), a, 0.0)))
    e_norm = float(np.linalg.norm(e))
    if e_norm == 0.0:
        return 1.0 if a_norm == 0.0 else 0.0
    fin = np.isfinite(a) & np.isfinite(e)
    denom = a_norm * e_norm
    return float(np.sum(a[fin] * e[fin]) / denom) if denom > 0 else 0.0
