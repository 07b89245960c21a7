"""Run one (cell, backend) pair in this process and build its record.

Used by the runner's worker processes and, directly, by the pytest matrix. Inputs are drawn once
per cell (cached), the backend runs on a private copy, and the family's check decides.
"""
from __future__ import annotations

import time
import traceback
from functools import lru_cache

from conformance import families, registry
from conformance.cells import Cell


@lru_cache(maxsize=4)
def _inputs(cell: Cell) -> dict:
    return families.get(cell.family).make_inputs(cell)


def base_record(cell: Cell, backend: registry.Backend) -> dict:
    return {"id": cell.id, "family": cell.family, "op": cell.op, "params": cell.as_dict(),
            "seed": cell.seed, "backend": backend.name, "rounding_model": backend.rounding_model}


def static_record(cell: Cell, backend: registry.Backend, status: str, reason: str) -> dict:
    """A record decided without running the kernel (skip) or without a record from the worker (crash)."""
    return {**base_record(cell, backend), "status": status, "reason": reason, "duration_s": 0.0}


def run_one(cell: Cell, backend_name: str) -> dict:
    """Run the backend on the cell and check it; exceptions become ``error`` records."""
    backend = registry.get(backend_name)
    record = base_record(cell, backend)
    reason = backend.skip_reason(cell)
    if reason is not None:
        return {**record, "status": "skip", "reason": reason, "duration_s": 0.0}
    family = families.get(cell.family)
    start = time.perf_counter()
    try:
        inputs = _inputs(cell)
        outputs = backend.run(cell, registry.inputs_copy(inputs))
        duration = time.perf_counter() - start
        result = family.check(cell, backend, inputs, outputs)
    except Exception as exc:
        tb = traceback.format_exc(limit=-3)
        return {**record, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": tb, "duration_s": time.perf_counter() - start}
    status, reason = result.status, result.reason
    xfail = backend.xfail(cell)
    if xfail is not None:
        status, reason = ("xfail", f"{xfail} ({reason})") if status == "fail" else ("xpass", f"expected to fail: {xfail}")
    worst = result.worst()
    record.update(
        status=status, reason=reason,
        metrics=worst.metrics if worst else {},
        outputs={c.name: {**c.metrics, "passed": c.passed} for c in result.comparisons},
        tolerance=worst.tolerance.as_dict() if worst else None,
        quality=result.quality, duration_s=duration)
    return record
