"""Kernel families. Each package (or module) here is one family, discovered, not listed; extra
modules (a toy family in tests, say) are named comma-separated in KERNEL_LAB_FAMILY_MODULES.
A family exports:

    FAMILY: str                                   # "gdn", "turboquant"
    OPS: tuple[str, ...]                          # the family's ops, in matrix order
    MODELS: dict[str, RoundingModel]              # the rounding models (conformance.rounding), by name: the
                                                  # oracle variants, where they differ, their tolerance terms
    ROUNDING_MODELS: dict[str, str]               # name -> words of MODELS; a backend names one per family
                                                  # (Backend.rounding_models)
    SPECS: tuple[ToleranceSpec, ...]              # the tolerances as data (conformance.compare)
    PLANTED: tuple[PlantedBug, ...]               # the planted bugs (conformance.planting) SPECS name
    def cells(tier: str) -> list[Cell]            # tier in TIERS; deterministic order
    def make_inputs(cell: Cell) -> dict           # NumPy arrays and scalars, drawn from cell.rng()
    def run_with(impl, cell, inputs) -> dict      # runs cell.op through impl, an object with the family
        # reference's function names (reference.<family>.numpy_ref's signatures, NumPy in-place or JAX
        # functional form); returns the outputs dict check expects. Backends call it with their kernels.
    def check(cell, rounding_model, inputs, outputs, memo=None) -> conformance.compare.Verdict
        # inputs: the pristine inputs (the backend ran on a copy); outputs: what the backend returned;
        # rounding_model: one of ROUNDING_MODELS; memo: a conformance.memo.Memo for oracles (None: none
        # kept). Compares with conformance.compare.compare under tolerances derived from numerics.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from functools import lru_cache
from types import ModuleType

from conformance.errors import UsageError

TIERS = ("smoke", "ci", "full")
PROTOCOL = ("FAMILY", "OPS", "MODELS", "ROUNDING_MODELS", "SPECS", "PLANTED", "cells", "make_inputs", "run_with",
            "check")


def _load(name: str) -> ModuleType:
    mod = importlib.import_module(name)
    missing = [attr for attr in PROTOCOL if not hasattr(mod, attr)]
    if missing:
        raise TypeError(f"family module {name} lacks {', '.join(missing)} (see conformance.families)")
    return mod


@lru_cache(maxsize=None)
def _discover(extra: str) -> dict[str, ModuleType]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = _load(f"{__name__}.{info.name}")
        out[mod.FAMILY] = mod
    for name in filter(None, (n.strip() for n in extra.split(","))):
        mod = _load(name)
        out[mod.FAMILY] = mod
    return out


def families() -> dict[str, ModuleType]:
    """All family modules, by FAMILY name (discovered once per value of KERNEL_LAB_FAMILY_MODULES)."""
    return dict(_discover(os.environ.get("KERNEL_LAB_FAMILY_MODULES", "")))


def get(name: str) -> ModuleType:
    """The family called ``name``; a UsageError naming the known ones otherwise."""
    all_ = families()
    if name not in all_:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(all_)}")
    return all_[name]
