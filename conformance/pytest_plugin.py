"""The conformance matrix inside any project's pytest run (entry point ``pytest11``, so installing
kernel-lab loads it): ``pytest --kernel-lab-tier ci --kernel-lab-backend mine`` adds one test per
(cell, backend) of the tier, judged in-process by the family's check and tolerances as
``kernel-lab conform`` judges it (the runner isolates crashes in worker processes; this does not).
A backend from another package registers through the ``kernel_lab.backends`` entry point group
(``conformance.plugins``). Without ``--kernel-lab-tier`` the plugin adds nothing.

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
from conformance.run import probe
from conformance.run.inprocess import run_one


@lru_cache(maxsize=None)
def _probe(name: str) -> tuple[bool, str]:
    return probe.probe(registry.get(name))


def check_pair(cell: Cell, backend_name: str) -> dict:
    """Run the pair and judge it as a test: skip (with the reason) when the backend is unavailable,
    needs an environment this process lacks, or does not serve the cell; fail unless the record
    passes or fails as declared. Returns the record."""
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
    source = (record.get("tolerance") or {}).get("source", "no tolerance recorded")
    assert record["status"] in ("pass", "xfail"), f"{record['status']}: {record['reason']} [tolerance: {source}]"
    return record


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


class MatrixItem(pytest.Item):
    def __init__(self, *, cell: Cell, backend: str, **kw):
        super().__init__(**kw)
        self.cell, self.backend = cell, backend

    def runtest(self) -> None:
        check_pair(self.cell, self.backend)

    def reportinfo(self):
        return self.path, None, f"kernel-lab {self.cell.id} on {self.backend}"


def pytest_addoption(parser):
    group = parser.getgroup("kernel-lab", "the kernel-lab conformance matrix")
    group.addoption("--kernel-lab-tier", metavar="TIER", help="add the matrix of this tier (smoke, ci, full)")
    group.addoption("--kernel-lab-backend", metavar="B[,B...]", help="only these backends (default: every one)")
    group.addoption("--kernel-lab-family", metavar="F", help="only this family")
    group.addoption("--kernel-lab-cells", metavar="REGEX", help="only cells whose id matches REGEX")


def pytest_collection_modifyitems(session, config, items):
    tier = config.getoption("--kernel-lab-tier")
    if tier is None:
        return
    names = config.getoption("--kernel-lab-backend")
    backends = [n.strip() for n in names.split(",") if n.strip()] if names else None
    for cell, backend in pairs(tier, backends, config.getoption("--kernel-lab-family"),
                               config.getoption("--kernel-lab-cells")):
        items.append(MatrixItem.from_parent(session, name=f"kernel-lab::{cell.id}@{backend}", cell=cell, backend=backend))
