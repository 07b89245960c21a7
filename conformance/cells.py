"""A conformance cell: one point of a family's axes, with a stable human-readable id.

The id is ``family/op/name=value/.../seed=N``; tuple values are joined with ``+``
(``lens=63+129``). Inputs of a cell are drawn from ``cell.rng()``, which is seeded from
the id, so a cell means the same numbers on every machine and in every process.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conformance.errors import UsageError


def refuse_control_characters(what: str, text: str) -> str:
    """``text``, or UsageError (a ValueError) when it holds a control character (C0, DEL or C1: a newline, an
    escape sequence, a NUL), which would garble a record line, a terminal or a shell command."""
    bad = sorted({c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0})
    if bad:
        raise UsageError(f"{what} {text!r} holds control characters ({', '.join(repr(c) for c in bad)}); "
                         "ids and names must be printable")
    return text


def format_value(value: Any) -> str:
    """Render one parameter value for a cell id."""
    if isinstance(value, (tuple, list)):
        return "+".join(format_value(v) for v in value) if value else "none"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


@dataclass(frozen=True)
class Cell:
    """One matrix point. ``params`` keeps its order: it is the order of the id. ``source``: the
    file its inputs are read from (``conformance.inputs.captured``; None: drawn from ``rng``), not part
    of the id, of equality or of the hash."""

    family: str
    op: str
    params: tuple[tuple[str, Any], ...]
    seed: int = 0
    source: str | None = field(default=None, compare=False, repr=False)

    @property
    def id(self) -> str:
        parts = [self.family, self.op]
        parts += [f"{name}={format_value(value)}" for name, value in self.params]
        parts.append(f"seed={self.seed}")
        return "/".join(parts)

    def __getitem__(self, name: str) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(f"cell {self.id} has no parameter {name!r}")

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v) for name, v in self.params}

    def rng(self, stream: int = 0) -> np.random.Generator:
        """Deterministic generator for this cell (``stream`` separates independent draws)."""
        digest = hashlib.sha256(self.id.encode()).digest()
        return np.random.default_rng([int.from_bytes(digest[:8], "little"), stream])


def make_cell(family: str, op: str, *, seed: int = 0, **params: Any) -> Cell:
    """Build a cell; keyword order is id order. Lists become tuples (cells are hashable). An id
    with a control character is refused (ValueError)."""
    frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items())
    cell = Cell(family, op, frozen, seed)
    refuse_control_characters("cell id", cell.id)
    return cell


def activation(cell: Cell) -> str:
    """The dtype of the cell's activations (its ``act`` parameter); cells recorded before that axis
    existed have none and mean bfloat16."""
    return cell.get("act", "bfloat16")
