"""The verdicts of a relation between runs (``conformance.relations`` for GDN,
``conformance.turboquant_relations``), best first, and the worst of several; ``BackendRuns``, one
backend's runs of a family and the verdict on two of them."""
from __future__ import annotations

import numpy as np

from conformance import families, registry
from conformance.cells import Cell
from conformance.memo import Memo
from conformance.run.inprocess import inputs_copy

VERDICTS = ("bitwise", "within bound", "not", "n/a")      # best first; "n/a" never outranks a result


def worst(verdicts) -> str:
    """The worst of some verdicts ("n/a" only when there is nothing else)."""
    found = [v for v in verdicts if v != "n/a"]
    return max(found, key=VERDICTS.index) if found else "n/a"


class BackendRuns:
    """One backend's runs of one family's cells (in this process), and the verdict on two of them."""

    def __init__(self, backend_name: str, family: str):
        self.backend = registry.get(backend_name)
        self.ops = set(self.backend.ops.get(family, ()))
        self.model = self.backend.rounding_model(family)
        self.family = families.get(family)
        self.memo = Memo()

    def supported(self, cell: Cell) -> str | None:
        """None where the backend runs ``cell``, else why not (``skip_reason``)."""
        return self.backend.skip_reason(cell)

    def run(self, cell: Cell, inputs: dict) -> dict:
        """The backend's outputs of ``cell`` on a copy of ``inputs``."""
        return self.backend.run(cell, inputs_copy(inputs))

    def verdict(self, cell: Cell, inputs: dict, first: dict, spliced: dict, parts: list) -> str:
        """Compare ``first`` and ``spliced`` (``first`` with the second run's parts put in) on ``parts``
        ((output name, index) pairs): bitwise, or the family check of ``cell`` on ``spliced``."""
        if all(np.array_equal(np.asarray(first[n])[i], np.asarray(spliced[n])[i]) for n, i in parts):
            return "bitwise"
        result = self.family.check(cell, self.model, inputs, spliced, self.memo)
        return "within bound" if result.status == "pass" else "not"
