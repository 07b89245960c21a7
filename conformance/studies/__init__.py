"""Numerical studies (`kernel-lab study NAME`). Each module here (discovered), and each named by the
entry point group ``kernel_lab.studies`` or KERNEL_LAB_STUDY_MODULES (conformance.plugins), defines:

    NAME: str; DESCRIPTION: str
    def add_arguments(parser) -> None
    def run(args) -> dict          # JSON-able result, written to --out
    def summarize(result) -> str   # a short table for the terminal
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from conformance import plugins


def studies() -> dict[str, ModuleType]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out[mod.NAME] = mod
    for mod in plugins.load("studies"):  # other packages' studies (conformance.plugins)
        out[mod.NAME] = mod
    return out
