"""A rounding model as one record: everything the engine and the tests need to know about one
oracle variant of a family, so that a new model is one new record and nothing else.

A family's ``models.MODELS`` maps names to ``RoundingModel`` records; its ``ROUNDING_MODELS``
(name -> words, the family protocol) is derived from them, and so are its oracle and tolerance
choices and the planted-bug runs of ``tests/conformance/test_planted_bugs.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from conformance.cells import Cell, activation
from conformance.compare import ToleranceSpec


class Oracle(Protocol):
    """One oracle variant of a family (``families.<family>.oracle``): a record with a name, and what the
    family's check needs to compute it."""

    name: str


@dataclass(frozen=True)
class RoundingModel:
    """name:         the model's name, as backends declare it (``Backend.rounding_models``).
    words:        one line saying what it models.
    activations:  the activation dtypes it is defined for (None: every one).
    differs_on:   the ops where its oracle or tolerance differs from "exact" (None: every op);
                  elsewhere a backend of this model is judged as an exact one.
    oracle:       op -> the family's oracle record for it (``Oracle``; ``"*"``: every other op; absent: the
                  exact one).
    terms:        op -> the tolerance terms it adds to the exact ones (``"*"``: every other op).
    reference:    builds the NumPy implementation that computes like the model: the base the
                  planted bugs are planted into.
    unread:       planted bugs with nothing to act on under this model (it never reads what they break).
    undetectable: planted bugs below this model's tolerance (their tests are strict xfails).
    """

    name: str
    words: str
    reference: Callable[[], Any]
    activations: tuple[str, ...] | None = None
    differs_on: tuple[str, ...] | None = ()
    oracle: Mapping[str, Oracle] = field(default_factory=dict)
    terms: Mapping[str, tuple[ToleranceSpec, ...]] = field(default_factory=dict)
    unread: frozenset[str] = frozenset()
    undetectable: frozenset[str] = frozenset()

    def defined_for(self, cell: Cell) -> bool:
        """Whether the model is defined for the cell's activation dtype."""
        return self.activations is None or activation(cell) in self.activations

    def oracle_on(self, op: str, exact: Oracle) -> Oracle:
        """The oracle of ``op`` (``exact`` where the model names none)."""
        return self.oracle.get(op, self.oracle.get("*", exact))

    def terms_on(self, op: str) -> tuple[ToleranceSpec, ...]:
        """The tolerance terms the model adds on ``op``."""
        return self.terms.get(op, self.terms.get("*", ()))

    def runs_on(self, op: str) -> bool:
        """Whether ``op`` is one where the model differs from exact (planted bugs run there)."""
        return self.differs_on is None or op in self.differs_on


def by_name(models: tuple[RoundingModel, ...]) -> dict[str, RoundingModel]:
    """The records by name (a name twice is a bug of the family)."""
    out = {m.name: m for m in models}
    if len(out) != len(models):
        raise ValueError(f"rounding models named twice: {[m.name for m in models]}")
    return out


def lookup(models: Mapping[str, RoundingModel], name: str) -> RoundingModel:
    """``models[name]``; a ValueError naming the known models otherwise."""
    if name not in models:
        raise ValueError(f"rounding_model: expected one of {sorted(models)}, got {name!r}")
    return models[name]
