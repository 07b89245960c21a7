"""The checks every family's ``CAPTURED`` module shares: the keys a file must hold, the members' shapes
against each other, dtypes, index tables. Each failure is an ``InputsError`` naming the key and what was
expected. The shape and dtype checks read only ``.shape`` and ``.dtype``: they take a file's headers
(``tensor_files.Member``) as well as arrays."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from conformance.errors import shown


INDEX_DTYPES = ("int32", "int64")


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


def check_shapes(members: Mapping, template: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """The dimensions of ``template`` as ``members`` declare them; InputsError naming the first member, in
    template order, whose shape is not the one the other members imply, and those members.

    ``template`` gives each member's shape as dimension names (``"N+1"``: one more than N); members absent
    from ``members`` are left out. A dimension takes the value most members of the right rank declare (a
    member counts once, by its first dimension of that name), a tie going to the smaller value: one forged
    member (a huge q beside k, v of the same T) is the one named, and of two that disagree alone the larger is,
    before any data is read."""
    declared: dict[str, dict[str, int]] = {}   # member -> dimension -> size, members of the right rank
    for name, dims in template.items():
        if name in members and len(members[name].shape) == len(dims):
            sizes = declared.setdefault(name, {})
            for dim, size in zip(dims, members[name].shape):
                symbol, plus = _dim(dim)
                if int(size) >= plus:   # cu_seqlens of no entries declares no N
                    sizes.setdefault(symbol, int(size) - plus)
    votes: dict[str, dict[int, int]] = {}
    for sizes in declared.values():
        for symbol, size in sizes.items():
            count = votes.setdefault(symbol, {})
            count[size] = count.get(size, 0) + 1
    dims_of = {symbol: min(count, key=lambda size: (-count[size], size)) for symbol, count in votes.items()}
    for name, dims in template.items():
        if name not in members:
            continue
        implied = []
        for dim in dims:
            symbol, plus = _dim(dim)
            implied.append(dims_of[symbol] + plus if symbol in dims_of else dim)
        shape = [int(size) for size in members[name].shape]
        if shape != implied:
            off = {_dim(d)[0] for d, size, want in zip(dims, shape, implied) if size != want}
            if len(shape) != len(dims):
                off = set()
            others = [o for o, sizes in declared.items() if o != name and any(sizes.get(s) == dims_of[s] for s in off)]
            who = f"{', '.join(others)} {'imply' if len(others) > 1 else 'implies'}"
            raise InputsError(f"{name}: declared shape {shape}; {who if others else 'the other members imply'} "
                              f"[{', '.join(map(str, implied))}] ({', '.join(dims)})")
    return dims_of


def _dim(dim: str) -> tuple[str, int]:
    """``"N+1"`` -> ("N", 1); ``"T"`` -> ("T", 0)."""
    symbol, _, plus = dim.partition("+")
    return symbol, int(plus or 0)


def dtype_in(name: str, a, allowed: Iterable[str], what: str = "") -> str:
    """The dtype name of ``a``, or InputsError naming ``name`` unless it is one of ``allowed``."""
    allowed = tuple(allowed)
    if a.dtype.name not in allowed:
        raise InputsError(f"{name}: dtype {a.dtype.name}, expected {' or '.join(allowed)}{what}")
    return a.dtype.name


def index_dtype(name: str, a) -> str:
    """The dtype name of an index table (int32 or int64; InputsError naming it otherwise)."""
    return dtype_in(name, a, INDEX_DTYPES)


def index_table(name: str, a: np.ndarray, dtype) -> np.ndarray:
    """An int32 or int64 index array as ``dtype`` (np.int32 or np.int64; InputsError naming it for
    another dtype or values outside ``dtype``)."""
    index_dtype(name, a)
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise InputsError(f"{name}: entries outside the {np.dtype(dtype).name} range")
    return a.astype(dtype)
