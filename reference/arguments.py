"""Argument checks both reference families share, and the launchers reuse so that bad input reads
the same everywhere: data arrays must be arrays, index sequences may be Python lists."""
from __future__ import annotations

import numpy as np


def array(name: str, x) -> None:
    """TypeError naming the argument unless ``x`` is an array (NumPy, JAX, torch: anything with a
    shape and a dtype). A Python list or tuple of values is refused, not converted: data arrays
    keep their dtype; index sequences are converted by ``indices``."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")


def in_place(name: str, x, what: str) -> None:
    """ValueError naming the argument when ``x`` is a read-only NumPy array (``what``: why it is
    written), before any work is done."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{name}: the NumPy array is read-only; {what}")


def indices(name: str, x) -> np.ndarray:
    """A Python list or tuple of integers (an index sequence) as an int32 NumPy array; anything
    else is returned unchanged. TypeError/ValueError naming the argument for non-integers, ragged
    nesting or entries outside int32."""
    if isinstance(x, (list, tuple)):
        try:
            a = np.asarray(x)
        except ValueError:
            raise ValueError(f"{name}: a ragged Python {type(x).__name__}, not a rectangular table") from None
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got a Python {type(x).__name__} of {a.dtype.name}")
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            raise ValueError(f"{name}: entries outside the int32 range")
        return a.astype(np.int32)
    return x
