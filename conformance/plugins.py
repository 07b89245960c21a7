"""Modules of other packages that extend the lab, found by package entry points
(``importlib.metadata``) and, as overrides, by environment variables.

Entry point groups, each entry naming a module (``name = "my_pkg.my_module"``):

- ``kernel_lab.backends``: a module that calls ``conformance.registry.register`` on import;
- ``kernel_lab.families``: a family module (the protocol of ``conformance.families``);
- ``kernel_lab.studies``: a study module (the protocol of ``conformance.studies``).

The variables ``KERNEL_LAB_BACKEND_MODULES``, ``KERNEL_LAB_FAMILY_MODULES`` and
``KERNEL_LAB_STUDY_MODULES`` (module names, comma-separated) add modules for one call, e.g. ones not
installed as a package; an installed entry point needs no variable, so ``--resume`` and later calls
see the same backends.
"""
from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from types import ModuleType

from conformance.errors import UsageError

VARIABLES = {"backends": "KERNEL_LAB_BACKEND_MODULES", "families": "KERNEL_LAB_FAMILY_MODULES",
             "studies": "KERNEL_LAB_STUDY_MODULES"}


def module_names(kind: str, installed: bool = True) -> list[tuple[str, str]]:
    """(module name, where it was named) of ``kind`` (backends, families or studies): the
    variable's modules, then (``installed``) the entry points of group ``kernel_lab.<kind>`` by
    entry name; each once. Reading the entry points scans every installed package's metadata
    (a few tenths of a second in a large environment)."""
    out: dict[str, str] = {}
    for name in filter(None, (n.strip() for n in os.environ.get(VARIABLES[kind], "").split(","))):
        out.setdefault(name, VARIABLES[kind])
    for ep in sorted(entry_points(group=f"kernel_lab.{kind}") if installed else (), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else "an installed package"
        out.setdefault(ep.module, f"entry point {ep.name!r} (group kernel_lab.{kind}) of {dist}")
    return list(out.items())


class PluginImportError(ImportError, UsageError):
    """A module named by an entry point or variable does not import (a bad request: one CLI line)."""


def load(kind: str, installed: bool = True) -> list[ModuleType]:
    """The modules of ``kind``, imported; a PluginImportError (an ImportError) names the entry point
    or variable."""
    mods = []
    for name, where in module_names(kind, installed):
        try:
            mods.append(importlib.import_module(name))
        except ImportError as exc:
            raise PluginImportError(f"{where}: cannot import {name} ({exc})") from exc
    return mods
