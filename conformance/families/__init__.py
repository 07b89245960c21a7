"""Kernel families. Each package (or module) here is one family, discovered, not listed; other
packages add theirs through the entry point group ``kernel_lab.families`` or, for one call (a toy
family in tests, say), module names comma-separated in KERNEL_LAB_FAMILY_MODULES (conformance.plugins).
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
    REFUSALS: tuple[Refusal, ...], POOL: str     # optional: the bad inputs every implementation of an op refuses
        # (conformance.refusals), and the input a refused call must leave as it was; tests/unit/test_refusals.py
        # runs every row against every registered backend that holds the argument contract
    CAPTURED: module | None                       # optional: the ops that take captured tensors from a file
        # (``conform --inputs``): OPS, keys(op) -> (required, optional, strings) names and
        # check_headers(op, members) (shapes and dtypes against each other), both checked against the file's
        # headers before its data is read; TABLES, the small index tables read first, and
        # check_tables(op, members, tables) (their values against the other members' shapes); then
        # derive(op, arrays, strings) -> (params, inputs), checked with conformance.inputs.checks;
        # conformance.inputs.captured turns a file into a cell. None or absent: the family takes no file.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from functools import lru_cache
from types import ModuleType

from conformance import plugins
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
def _builtin() -> dict[str, ModuleType]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = _load(f"{__name__}.{info.name}")
        out[mod.FAMILY] = mod
    return out


@lru_cache(maxsize=None)
def _discover(extra: str) -> dict[str, ModuleType]:
    out = dict(_builtin())
    for name, _ in plugins.module_names("families"):
        mod = _load(name)
        out[mod.FAMILY] = mod
    return out


def families() -> dict[str, ModuleType]:
    """All family modules, by FAMILY name: this package's, then those of entry points and of
    KERNEL_LAB_FAMILY_MODULES (``conformance.plugins``; discovered once per value of the variable)."""
    return dict(_discover(os.environ.get(plugins.VARIABLES["families"], "")))


def get(name: str) -> ModuleType:
    """The family called ``name``; a UsageError naming the known ones otherwise. This package's
    families are found without reading the installed packages' entry points (a worker process
    starts faster)."""
    if name in _builtin():
        return _builtin()[name]
    all_ = families()
    if name not in all_:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(all_)}")
    return all_[name]
