"""How long a run will take: a cell's work (tokens * heads * head dims), the interpreter work
budget, each backend's cost per cell, the ``Estimator`` that rescales them from finished records,
and the progress line with its ETA."""
from __future__ import annotations

import math
from collections import Counter
from typing import Mapping

from conformance import registry
from conformance.cells import Cell
from conformance.progress import ProgressLine


def cell_work(cell: Cell) -> int:
    """A cell's work in tokens * heads * head dims, from its parameters: tokens are ``sum(lens)``,
    ``ntok``, ``T`` or ``n``; heads ``HV`` or ``Hk * G``; dims ``D`` or ``K * K`` (a GDN state).
    Missing factors count 1. Used to estimate run time and for the interpreter work budget."""
    p = cell.as_dict()
    tokens = sum(p["lens"]) if "lens" in p else p.get("ntok") or p.get("T") or p.get("n") or 1
    heads = p.get("HV") or p.get("Hk", 1) * p.get("G", 1)
    dims = p.get("D") or p.get("K", 1) ** 2
    return int(tokens * heads * dims)


def work_budget(cell: Cell, backend: registry.Backend) -> float | None:
    """The backend's work budget for the cell's op (None: no budget)."""
    budget = backend.work_budget
    return budget.get(cell.op) if isinstance(budget, Mapping) else budget


def first_estimate(cell: Cell, backend: registry.Backend) -> float:
    """Seconds the backend is expected to take on the cell, before any record of it."""
    return backend.seconds_per_cell + backend.seconds_per_work * cell_work(cell)


class Estimator:
    """Remaining time: each pending pair's first estimate, scaled per backend and op by (seconds
    recorded) / (seconds estimated) over its finished pairs, divided among the workers."""

    def __init__(self, pending: list[tuple[Cell, registry.Backend]], jobs: int):
        self.jobs = max(1, min(jobs, len(pending) or 1))
        self.left: Counter = Counter()
        self.estimated: Counter = Counter()
        self.actual: Counter = Counter()
        self._first: dict[tuple[str, str], float] = {}
        for cell, b in pending:
            self._first[cell.id, b.name] = est = first_estimate(cell, b)
            self.left[b.name, cell.op] += est

    def learn(self, cells: dict[str, Cell], backends: dict[str, registry.Backend], recs: list[dict]) -> None:
        """Calibrate from records already in the folder (on resume)."""
        for r in recs:
            if r["id"] in cells and r["backend"] in backends and r["status"] != "skip":
                kind = r["backend"], r["op"]
                self.estimated[kind] += first_estimate(cells[r["id"]], backends[r["backend"]])
                self.actual[kind] += float(r.get("duration_s") or 0.0)

    def done(self, record: dict) -> None:
        est = self._first.pop((record["id"], record["backend"]), None)
        if est is None:
            return
        kind = record["backend"], record["op"]
        self.left[kind] -= est
        self.estimated[kind] += est
        self.actual[kind] += float(record.get("duration_s") or 0.0)

    def per_backend(self) -> dict[str, float]:
        out: Counter = Counter()
        for kind, left in self.left.items():
            scale = self.actual[kind] / self.estimated[kind] if self.estimated[kind] > 0 else 1.0
            out[kind[0]] += max(0.0, left) * scale
        return {b: s for b, s in out.items() if s > 0}

    def remaining(self) -> float:
        return sum(self.per_backend().values()) / self.jobs


class Progress:
    """The run's progress line on stderr, with its ETA and status tally."""

    def __init__(self, total: int, estimator: Estimator, stream):
        self.done, self.estimator = 0, estimator
        self.counts: Counter = Counter()
        self.line = ProgressLine(total, stream)

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["status"]] += 1
        self.estimator.done(record)
        tally = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        self.line.show(self.done, f"ETA {hms(self.estimator.remaining())} {tally}")

    def close(self) -> None:
        self.line.close()


def hms(seconds: float) -> str:
    """Seconds as ``1h02m`` or ``3m07s``; ``?`` when not finite."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
