"""The checks every family's ``CAPTURED.derive`` shares: the keys a file must hold, dtypes, index tables.
Each failure is an ``InputsError`` naming the key and what was expected."""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from conformance.errors import shown


class InputsError(ValueError):
    """A file's tensors that do not make the op's inputs: the message names the key."""


def check_keys(arrays: Mapping, strings: Mapping, required: Iterable[str], optional: Iterable[str] = (),
               optional_strings: Iterable[str] = ()) -> None:
    """InputsError for a missing array key (saying so when it came as a string) and for an array or
    string key not expected."""
    required, optional, optional_strings = tuple(required), tuple(optional), tuple(optional_strings)
    for name in required:
        if name not in arrays:
            where = " (found as a string)" if name in strings else ""
            raise InputsError(f"{name}: missing{where}; expected arrays {', '.join(required)}"
                              + (f" (optional: {', '.join(optional)})" if optional else ""))
    extra = sorted(set(arrays) - set(required) - set(optional))
    if extra:
        raise InputsError(f"{', '.join(map(shown, extra))}: not an argument of this op; expected arrays "
                          f"{', '.join(required + optional)}")
    extra = sorted(set(strings) - set(optional_strings))
    if extra:
        known = f"expected strings: {', '.join(optional_strings)}" if optional_strings else "expected none"
        raise InputsError(f"{', '.join(map(shown, extra))}: an unexpected string; {known}")


def dtype_in(name: str, a: np.ndarray, allowed: Iterable[str], what: str = "") -> str:
    """The dtype name of ``a``, or InputsError naming ``name`` unless it is one of ``allowed``."""
    allowed = tuple(allowed)
    if a.dtype.name not in allowed:
        raise InputsError(f"{name}: dtype {a.dtype.name}, expected {' or '.join(allowed)}{what}")
    return a.dtype.name


def index_table(name: str, a: np.ndarray, dtype) -> np.ndarray:
    """An int32 or int64 index array as ``dtype`` (np.int32 or np.int64; InputsError naming it for
    another dtype or values outside ``dtype``)."""
    dtype_in(name, a, ("int32", "int64"))
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise InputsError(f"{name}: entries outside the {np.dtype(dtype).name} range")
    return a.astype(dtype)
