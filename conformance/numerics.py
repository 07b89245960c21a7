"""Floating-point facts the lab's tolerances are built from, one definition each.

Unit roundoffs (half an ulp at 1, round to nearest): ``U32`` (float32), ``UBF16`` (bfloat16),
``UFP16`` (float16), ``U64`` (float64), and ``UNIT`` by dtype name; ``UNDERFLOW`` the absolute error
of rounding in a dtype's subnormal range. Round trips return float32 arrays that hold the
nearest (round-to-nearest-even) value of the narrow type. ``ACTIVATIONS`` names the dtypes a cell's
activations come in (its ``act`` axis) and ``to_activation`` rounds to one of them. Metrics take any real
arrays and work in float64.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

U64 = 2.0 ** -53
U32 = 2.0 ** -24
UBF16 = 2.0 ** -8
UFP16 = 2.0 ** -11
UNIT = {"float64": U64, "float32": U32, "bfloat16": UBF16, "float16": UFP16}
# Half the smallest subnormal: the absolute rounding error of a value in the subnormal range.
UNDERFLOW = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "bfloat16": 2.0 ** -134, "float16": 2.0 ** -25}
ACTIVATIONS = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
               "float32": np.dtype(np.float32)}


def to_activation(x, name: str) -> np.ndarray:
    """``x`` rounded to nearest even into the activation dtype ``name`` (an array of that dtype:
    ml_dtypes.bfloat16, float16 or float32); float16 overflow is refused, never turned into Inf."""
    if name not in ACTIVATIONS:
        raise ValueError(f"act: expected one of {', '.join(ACTIVATIONS)}, got {name!r}")
    out = np.asarray(x, np.float32).astype(ACTIVATIONS[name])
    if not np.all(np.isfinite(out.astype(np.float32))):
        raise ValueError(f"act: values beyond the {name} range (max |x| {float(np.max(np.abs(x))):.3g})")
    return out


def bf16_round(x) -> np.ndarray:
    """float32 array holding the nearest bfloat16 values of ``x`` (RNE)."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def fp16_ordinal(x) -> np.ndarray:
    """float16 bit patterns of ``x`` as int64 in value order: adjacent float16 values differ by 1."""
    bits = np.asarray(x, dtype=np.float16).view(np.int16).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


def _finite_norm(x: np.ndarray) -> float:
    """L2 norm of the finite elements of x (one pass when all are finite)."""
    norm = float(np.linalg.norm(x.ravel()))
    return norm if np.isfinite(norm) else float(np.linalg.norm(x[np.isfinite(x)]))


def l2_metrics(actual, expected) -> tuple[float, float]:
    """(rel_l2, cosine) of ``actual`` against ``expected``, in float64, over the finite elements.

    rel_l2 = ||actual - expected|| / ||expected|| (the absolute norm when expected is 0); cosine is 1
    when both are 0 and 0 when one is. Non-finite values are left out (``compare`` counts them)."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    e_norm = float(np.linalg.norm(e))
    rel = _relative(_finite_norm(a - e), e_norm)
    a_norm = _finite_norm(a)
    if e_norm == 0.0:
        return rel, 1.0 if a_norm == 0.0 else 0.0
    if a_norm == 0.0:
        return rel, 0.0
    dot = float(np.dot(a, e))
    if not np.isfinite(dot):
        fin = np.isfinite(a) & np.isfinite(e)
        dot = float(np.dot(a[fin], e[fin]))
    return rel, dot / (a_norm * e_norm)


def _relative(d_norm: float, e_norm: float) -> float:
    return d_norm / e_norm if e_norm else d_norm


def rel_l2(actual, expected) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (as in ``l2_metrics``, without the cosine)."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    return _relative(_finite_norm(a - e), float(np.linalg.norm(e)))


def cosine(actual, expected) -> float:
    """Cosine similarity (``l2_metrics``)."""
    return l2_metrics(actual, expected)[1]
