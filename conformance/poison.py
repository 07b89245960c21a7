"""Poisoned output buffers: a backend that writes into caller-provided outputs gets them from
here, so an element it never writes shows up as NaN (floats) or a sentinel (integers) and fails."""
from __future__ import annotations

import numpy as np

INT_SENTINEL = 0x5A  # repeated byte pattern for integer outputs (0x5A5A... for wider types)


def poisoned(shape, dtype) -> np.ndarray:
    """An array of ``shape``/``dtype`` filled with NaN (floating types) or 0x5A bytes."""
    dt = np.dtype(dtype)
    out = np.empty(shape, dtype=dt)
    if dt.kind == "f" or dt.name in ("bfloat16",):
        out[...] = np.nan
    else:
        out.view(np.uint8)[...] = INT_SENTINEL
    return out
