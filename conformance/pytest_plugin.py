"""The conformance matrix inside any project's pytest run (entry point ``pytest11``, so installing
kernel-lab loads it). A test module of the project asks for the matrix with two lines:

    from conformance.pytest_plugin import test_kernel_lab  # noqa: F401

and ``pytest --kernel-lab-tier ci --kernel-lab-backend mine`` runs one test per (cell, backend) of
the tier, judged in-process by the family's check and tolerances as ``kernel-lab conform`` judges
it (the runner isolates crashes in worker processes; this does not). A backend from another
package registers through the ``kernel_lab.backends`` entry point group (``conformance.plugins``).
Without ``--kernel-lab-tier`` the matrix is empty.

Test ids are the cell id with ``:`` for ``=`` and the backend last
(``gdn/decode/.../G:16/seed:0/backend:mine``), words that pytest's ``-k`` takes (``-k "G:16 and
mine"``); node ids, ``--lf``/``--ff`` and pytest-xdist work as for any parametrized test. A failing
pair fails with the lab's one paragraph (margin, deciding criterion, tolerance and its source, the
``kernel-lab conform`` command that reproduces it), not a traceback.

Options: ``--kernel-lab-tier T``, ``--kernel-lab-backend B[,B...]`` (default: every backend),
``--kernel-lab-family F``, ``--kernel-lab-cells REGEX`` (a regular expression on the cell id).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

import pytest

from conformance import families, registry
from conformance.cells import Cell
from conformance.run import probe, repro
from conformance.run.inprocess import run_one


@lru_cache(maxsize=None)
def _probe(name: str) -> tuple[bool, str]:
    return probe.probe(registry.get(name))


def check_pair(cell: Cell, backend_name: str, tier: str | None = None) -> dict:
    """Run the pair and judge it as a test: skip (with the reason) when the backend is unavailable,
    needs an environment this process lacks, or does not serve the cell; fail with the record's
    one paragraph (``repro.verdict``) unless it passes or fails as declared. Returns the record."""
    backend = registry.get(backend_name)
    ok, why = _probe(backend_name)
    if not ok:
        pytest.skip(f"{backend_name} unavailable: {why}")
    wrong_env = {k: v for k, v in backend.env.items() if os.environ.get(k) != v}
    if wrong_env:
        pytest.skip(f"{backend_name} needs {wrong_env} in its process; `kernel-lab conform` sets it")
    record = run_one(cell, backend_name)
    if record["status"] == "skip":
        pytest.skip(record["reason"])
    if record["status"] not in ("pass", "xfail"):
        pytest.fail(repro.verdict(record, tier), pytrace=False)
    return record


def pair_id(cell: Cell, backend_name: str) -> str:
    """The pair's pytest id: words ``-k`` takes (``=`` is not one of them)."""
    return f"{cell.id.replace('=', ':')}/backend:{backend_name}"


def pairs(tier: str, backends: list[str] | None = None, family: str | None = None,
          pattern: str | None = None) -> list[tuple[Cell, str]]:
    """(cell, backend name) of the tier for every backend that implements the cell's family."""
    if tier not in families.TIERS:
        raise pytest.UsageError(f"--kernel-lab-tier {tier!r}: expected one of {', '.join(families.TIERS)}")
    known = registry.backends()
    unknown = [b for b in backends or () if b not in known]
    if unknown:
        raise pytest.UsageError(f"--kernel-lab-backend: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        wanted = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise pytest.UsageError(f"--kernel-lab-cells {pattern!r}: not a regular expression ({exc})") from None
    out = []
    for name, fam in families.families().items():
        if family is not None and name != family:
            continue
        for cell in fam.cells(tier):
            if wanted is not None and not wanted.search(cell.id):
                continue
            out += [(cell, b) for b in backends or known if cell.family in known[b].ops]
    return out


def params(tier: str, backends: list[str] | None = None, family: str | None = None, pattern: str | None = None,
           marks=None) -> list:
    """``pytest.param(cell, backend name)`` of each pair (``pairs``), with ``pair_id`` and the marks
    ``marks(cell, backend)`` gives (none without it)."""
    return [pytest.param(cell, name, id=pair_id(cell, name), marks=marks(cell, registry.get(name)) if marks else ())
            for cell, name in pairs(tier, backends, family, pattern)]


def test_kernel_lab(kernel_lab_cell, kernel_lab_backend, request):
    """One (cell, backend) pair of the matrix (imported into a project's test module)."""
    check_pair(kernel_lab_cell, kernel_lab_backend, request.config.getoption("--kernel-lab-tier"))


def pytest_addoption(parser):
    group = parser.getgroup("kernel-lab", "the kernel-lab conformance matrix")
    group.addoption("--kernel-lab-tier", metavar="TIER", help="the matrix of this tier (smoke, ci, full)")
    group.addoption("--kernel-lab-backend", metavar="B[,B...]", help="only these backends (default: every one)")
    group.addoption("--kernel-lab-family", metavar="F", help="only this family")
    group.addoption("--kernel-lab-cells", metavar="REGEX", help="only cells whose id matches REGEX")


def _options(config) -> tuple:
    names = config.getoption("--kernel-lab-backend")
    backends = [n.strip() for n in names.split(",") if n.strip()] if names else None
    return (config.getoption("--kernel-lab-tier"), backends, config.getoption("--kernel-lab-family"),
            config.getoption("--kernel-lab-cells"))


def pytest_configure(config):
    tier, backends, family, pattern = _options(config)
    if tier is not None:
        pairs(tier, backends, family, pattern)   # bad options: a usage error (exit 4) before collection


def pytest_generate_tests(metafunc):
    if "kernel_lab_cell" not in metafunc.fixturenames:
        return
    tier, backends, family, pattern = _options(metafunc.config)
    found = params(tier, backends, family, pattern) if tier is not None else []
    metafunc.parametrize("kernel_lab_cell,kernel_lab_backend", found)
