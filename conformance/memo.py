"""The oracle/input memo: values computed from a cell's inputs, keyed on the cell AND a digest of
those inputs, so the same cell with other inputs never gets a stale value back.

The in-process executor (``conformance.run.inprocess``) owns one and passes it to every family
``check``; a family asks ``memo.get(cell, inputs, what, compute)``, where ``what`` names the value
(and holds anything else it depends on, arrays included: they are digested too).
"""
from __future__ import annotations

import hashlib
import time
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
    """A bounded LRU of computed values keyed on ``(cell, digest(inputs), digest(what))``.

    Inputs drawn through ``inputs`` are the memo's own: their digest is computed once and they must
    not be mutated (callers run backends on copies); any other inputs are digested on every call."""

    def __init__(self, size: int = 16):
        self.size = size
        self._values: OrderedDict = OrderedDict()
        self._owned: dict[int, tuple[dict, str]] = {}
        self.computing_s = 0.0   # seconds spent computing values not kept yet (a value computed inside another once)
        self._depth = 0

    def _computed(self, compute: Callable[[], Any]) -> Any:
        """``compute()``, its time added to ``computing_s`` unless another value's computation holds it."""
        start = time.perf_counter()
        self._depth += 1
        try:
            return compute()
        finally:
            self._depth -= 1
            if not self._depth:
                self.computing_s += time.perf_counter() - start

    def _digest(self, inputs: Any) -> str:
        owned = self._owned.get(id(inputs))
        return owned[1] if owned is not None and owned[0] is inputs else digest(inputs)

    def _put(self, key, value) -> None:
        self._values[key] = value
        while len(self._values) > self.size:
            _, old = self._values.popitem(last=False)
            owned = self._owned.get(id(old))
            if owned is not None and owned[0] is old:
                del self._owned[id(old)]

    def inputs(self, cell: Cell, make: Callable[[Cell], dict]) -> dict:
        """``make(cell)``, drawn once per cell while the memo keeps it."""
        key = (cell, "inputs")
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        def draw() -> tuple[dict, str]:
            value = make(cell)
            return value, digest(value)

        value, kept = self._computed(draw)
        self._owned[id(value)] = (value, kept)
        self._put(key, value)
        return value

    def get(self, cell: Cell, inputs: dict, what: Any, compute: Callable[[], Any]) -> Any:
        """The memoised ``compute()`` for this cell, these inputs and ``what``."""
        key = (cell, self._digest(inputs), digest(what))
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = self._computed(compute)
        self._put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._values)
