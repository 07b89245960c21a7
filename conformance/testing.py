"""The helpers that show a family's tolerances catch its planted bugs, and every family's planted
bugs by name.

A planted bug (``conformance.planting.PlantedBug``, defined in its family's ``planted`` module) turns an
implementation (an object with the family reference's function names, as ``run_with`` takes it:
``reference.<family>.numpy_ref``, a backend's kernel wrapper) into the same implementation with one
classic kernel bug, so the same bug runs against the references, the C++ kernels, the Triton
kernels and the emulations. ``PLANTED`` holds them by name; each family's ``tolerances.SPECS``
names the bugs each tolerance is shown to catch.

    bug = PLANTED["gdn.head-mapping-tiled"]
    cell = first_failing_cell(bug.plant(numpy_ref), "gdn", "exact", [c for c in cells if bug.applies(c)])
"""
from __future__ import annotations

from typing import Iterable

from conformance import families
from conformance.cells import Cell
from conformance.compare import Comparison, Tolerance, Verdict, compare
from conformance.memo import Memo
from conformance.planting import PlantedBug
from conformance.run.inprocess import inputs_copy


def assert_close(name: str, actual, expected, tol: Tolerance) -> Comparison:
    """``compare`` under a named tolerance; AssertionError with the comparator's reason when it fails."""
    result = compare(name, actual, expected, tol)
    if not result.passed:
        raise AssertionError(f"{result.reason} [{tol.source}]")
    return result


def verdict_of(impl, cell: Cell, rounding_model: str, memo: Memo | None = None,
               inputs: dict | None = None) -> Verdict:
    """Run ``cell`` through ``impl`` (on a copy of its inputs) and check it under ``rounding_model``."""
    family = families.get(cell.family)
    inputs = family.make_inputs(cell) if inputs is None else inputs
    return family.check(cell, rounding_model, inputs, family.run_with(impl, cell, inputs_copy(inputs)), memo)


def first_failing_cell(impl, family: str, rounding_model: str, cells: Iterable[Cell],
                       memo: Memo | None = None) -> Cell | None:
    """The first of ``cells`` (of ``family``) that ``impl`` fails under ``rounding_model``, or None."""
    memo = Memo() if memo is None else memo
    for cell in cells:
        if cell.family != family:
            raise ValueError(f"cells: {cell.id} is not a {family} cell")
        if verdict_of(impl, cell, rounding_model, memo).status == "fail":
            return cell
    return None


PLANTED: dict[str, PlantedBug] = {bug.name: bug for module in families.families().values() for bug in module.PLANTED}


def reference_impl(family: str, rounding_model: str):
    """The NumPy reference implementation a backend of ``rounding_model`` computes like (the base
    the planted bugs are planted into in the family tests): the model record's ``reference``."""
    models = families.get(family).MODELS
    if rounding_model not in models:
        raise ValueError(f"no reference implementation of {family} for the {rounding_model!r} model")
    return models[rounding_model].reference()
