"""Run one (cell, backend) pair in this process and build its record.

Used by the runner's worker processes and, directly, by the pytest matrix. This module owns the
process's one memo (``MEMO``): a cell's inputs are drawn once, and the family's oracles are kept
under the cell and a digest of the inputs, so every backend checked on the cell shares them (a
record's ``setup_s``: the seconds its pair spent computing those the memo did not hold yet). The
backend runs on a private copy of the inputs, and the family's check decides.
"""
from __future__ import annotations

import contextlib
import copy
import time
import traceback
from typing import Any, Mapping

from conformance import families, paths, registry
from conformance.cells import Cell
from conformance.memo import Memo

MEMO = Memo(size=16)


def inputs_copy(inputs: Mapping[str, Any]) -> dict:
    """A private deep copy of a family's inputs (arrays copied, scalars shared)."""
    return copy.deepcopy(dict(inputs))


def cell_inputs(cell: Cell, memo: Memo = MEMO) -> dict:
    """The family's inputs of ``cell`` (drawn, or read from its file, once per cell while the memo
    keeps them; do not mutate)."""
    if cell.source is not None:
        from conformance.inputs import captured

        return memo.inputs(cell, captured.load_inputs)
    return memo.inputs(cell, families.get(cell.family).make_inputs)


def base_record(cell: Cell, backend: registry.Backend) -> dict:
    """The fields every record of the pair has, whatever its status."""
    return {"id": cell.id, "family": cell.family, "op": cell.op, "params": cell.as_dict(),
            "seed": cell.seed, "backend": backend.name, "rounding_model": backend.rounding_model(cell.family)}


def static_record(cell: Cell, backend: registry.Backend, status: str, reason: str,
                  path: str = paths.UNKNOWN) -> dict:
    """A record decided without running the kernel (skip) or without a record from the worker
    (crash): ``path`` is the one the backend would take, as its worker answered ``Backend.code_path``
    (``conformance.run.hook_answers``; this process never runs a backend's hook)."""
    return {**base_record(cell, backend), "status": status, "reason": reason, "duration_s": 0.0, "path": path}


def addresses_checked(backend: registry.Backend):
    """The interpreter's address check (``conformance.interpreter_addresses``) for a backend that runs Triton
    kernels in its interpreter; nothing for the others."""
    if not registry.in_interpreter(backend):
        return contextlib.nullcontext()
    from conformance.interpreter_addresses import checked_addresses

    return checked_addresses()


def run_one(cell: Cell, backend_name: str, memo: Memo = MEMO) -> dict:
    """Run the backend on the cell and check it; exceptions become ``error`` records."""
    backend = registry.get(backend_name)
    record = base_record(cell, backend)
    try:
        reason = backend.skip_reason(cell)
    except registry.HookError as exc:
        return {**record, "status": "error", "reason": str(exc), "duration_s": 0.0, "path": backend.code_path(cell)}
    if reason is not None:
        return {**record, "status": "skip", "reason": reason, "duration_s": 0.0, "path": backend.code_path(cell)}
    wrong_env = backend.env_problem()
    if wrong_env is not None:
        return {**record, "status": "error", "reason": wrong_env, "duration_s": 0.0, "path": backend.code_path(cell)}
    family = families.get(cell.family)
    start, computed = time.perf_counter(), memo.computing_s   # setup_s: the memo's misses (inputs, oracles)
    taken: list[str] = []   # the paths the run reported (paths.took); else the one it declares
    try:
        inputs = cell_inputs(cell, memo)
        with paths.observe() as taken, addresses_checked(backend):
            outputs = backend.run(cell, inputs_copy(inputs))
        duration = time.perf_counter() - start
        record["path"] = "+".join(taken) or backend.code_path(cell)
        result = family.check(cell, backend.rounding_model(cell.family), inputs, outputs, memo)
    except Exception as exc:
        tb = traceback.format_exc(limit=-3)
        return {**record, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": tb, "duration_s": time.perf_counter() - start, "setup_s": memo.computing_s - computed,
                "path": "+".join(taken) or backend.code_path(cell)}
    status, reason = result.status, result.reason
    try:
        xfail = backend.hook("xfail", cell)
    except registry.HookError as exc:
        return {**record, "status": "error", "reason": f"{exc} (the check said {status}: {reason or 'no reason'})",
                "duration_s": duration}
    if xfail is not None:
        status, reason = ("xfail", f"{xfail} ({reason})") if status == "fail" else ("xpass", f"expected to fail: {xfail}")
    worst = result.worst()
    record.update(
        status=status, reason=reason,
        metrics=worst.metrics if worst else {},
        decided_by={"output": worst.name, "criterion": worst.metrics.get("criterion")} if worst else None,
        outputs={c.name: {**c.metrics, "passed": c.passed} for c in result.comparisons},
        tolerance=worst.tolerance.as_dict() if worst else None,
        quality=result.quality, duration_s=duration, setup_s=memo.computing_s - computed)
    return record
