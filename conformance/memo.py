"""The oracle/input memo: values computed from a cell's inputs, keyed on the cell AND a digest of
those inputs, so the same cell with other inputs never gets a stale value back.

The in-process executor (``conformance.inprocess``) owns one and passes it to every family
``check``; a family asks ``memo.get(cell, inputs, what, compute)``, where ``what`` names the value
(and holds anything else it depends on, arrays included: they are digested too).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from conformance.cells import Cell


def _feed(h, obj: Any) -> None:
    if isinstance(obj, np.ndarray) or type(obj).__module__.startswith(("jax", "jaxlib")):
        a = np.ascontiguousarray(np.asarray(obj))
        h.update(f"nd{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=str):
            _feed(h, key)
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"(" if isinstance(obj, tuple) else b"[")
        for x in obj:
            _feed(h, x)
        h.update(b")")
    elif obj is None or isinstance(obj, (bool, int, float, str, np.generic)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"digest: cannot digest a {type(obj).__name__}")


def digest(obj: Any) -> str:
    """A content hash of nested dicts, lists, tuples, arrays (dtype, shape and bytes) and scalars."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, obj)
    return h.hexdigest()


class Memo:
    """A bounded LRU of computed values keyed on ``(cell, digest((inputs, what)))``."""

    def __init__(self, size: int = 16):
        self.size = size
        self._values: OrderedDict = OrderedDict()

    def get(self, cell: Cell, inputs: dict, what: Any, compute: Callable[[], Any]) -> Any:
        """The memoised ``compute()`` for this cell, these inputs and ``what``."""
        key = (cell, digest((inputs, what)))
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = compute()
        self._values[key] = value
        while len(self._values) > self.size:
            self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)
