"""Kernel families. Each module here (discovered, not listed; extra modules, e.g. a toy family in
tests, are named comma-separated in KERNEL_LAB_FAMILY_MODULES) defines one family:

    FAMILY: str                                   # "gdn", "turboquant"
    OPS: tuple[str, ...]                          # the family's ops, in matrix order
    def cells(tier: str) -> list[Cell]            # tier in TIERS; deterministic order
    def make_inputs(cell: Cell) -> dict           # NumPy arrays and scalars, drawn from cell.rng()
    def check(cell, backend, inputs, outputs) -> conformance.compare.Verdict
        # inputs: the pristine inputs (the backend ran on a copy); outputs: what backend.run returned.
        # The family computes its oracle for backend.rounding_model (caching it per cell) and
        # compares with conformance.compare.compare under tolerances derived from numerics.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from types import ModuleType

from conformance.errors import UsageError

TIERS = ("smoke", "ci", "full")


def families() -> dict[str, ModuleType]:
    """All family modules, by FAMILY name."""
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out[mod.FAMILY] = mod
    for name in filter(None, os.environ.get("KERNEL_LAB_FAMILY_MODULES", "").split(",")):
        mod = importlib.import_module(name.strip())
        out[mod.FAMILY] = mod
    return out


def get(name: str) -> ModuleType:
    all_ = families()
    if name not in all_:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(all_)}")
    return all_[name]
