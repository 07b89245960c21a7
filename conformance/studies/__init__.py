"""Numerical studies (`kernel-lab study NAME`). Each module here (discovered) defines:

    NAME: str; DESCRIPTION: str
    def add_arguments(parser) -> None
    def check(args) -> None        # ValueError naming the argument, before any work
    def run(args) -> dict          # JSON-able result, written to --out
    def summarize(result) -> str   # a short table for the terminal
"""
from __future__ import annotations

import importlib
import math
import pkgutil
from types import ModuleType


def bounded_int(option: str, value, least: int, most: int) -> int:
    """``value`` as an int in ``[least, most]``; ValueError naming ``option`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{option} {value}: expected an integer in [{least}, {most}]")
    return value


def int_list(option: str, text: str, least: int, most: int) -> list[int]:
    """Comma-separated integers, each in ``[least, most]``; ValueError naming ``option``."""
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated integers") from None
    for v in values:
        if not least <= v <= most:
            raise ValueError(f"{option} {text!r}: {v} is outside [{least}, {most}]")
    return values


def positive_float(option: str, value: float, most: float) -> float:
    if not (math.isfinite(value) and 0 < value <= most):
        raise ValueError(f"{option} {value}: expected a positive finite number up to {most:g}")
    return value


def studies() -> dict[str, ModuleType]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out[mod.NAME] = mod
    return out
