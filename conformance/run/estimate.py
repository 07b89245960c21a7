"""How long a run will take: a cell's work (tokens * heads * head dims), the interpreter work
budget, each backend's cost per cell, the ``Estimator`` that rescales them from finished records,
and the progress line with its ETA."""
from __future__ import annotations

import math
from collections import Counter
from typing import Mapping

from conformance import registry
from conformance.cells import Cell
from conformance.run.progress import ProgressLine

CHUNK_TOKENS = 64   # a chunked op computes whole chunks of this many tokens


def cell_work(cell: Cell) -> int:
    """A cell's work in tokens * heads * head dims, from its parameters: tokens are ``sum(lens)`` (a
    ``chunked`` op's sequences rounded up to whole chunks of CHUNK_TOKENS), ``ntok``, ``T`` or ``n``, times ``steps`` (a chain of calls); heads
    ``HV`` or ``Hk * G``; dims ``D`` or ``K * K`` (a GDN state). Missing factors count 1. Used to estimate
    run time and for the interpreter work budget."""
    p = cell.as_dict()
    if "lens" in p and cell.op == "chunked":
        tokens = sum(-(-n // CHUNK_TOKENS) * CHUNK_TOKENS for n in p["lens"])
    else:
        tokens = sum(p["lens"]) if "lens" in p else p.get("ntok") or p.get("T") or p.get("n") or 1
    tokens *= p.get("steps", 1)                 # a chain of decode calls
    heads = p.get("HV") or p.get("Hk", 1) * p.get("G", 1)
    dims = p.get("D") or p.get("K", 1) ** 2
    return int(tokens * heads * dims)


def work_budget(cell: Cell, backend: registry.Backend) -> float | None:
    """The backend's work budget for the cell's op (None: no budget)."""
    budget = backend.work_budget
    return budget.get(cell.op) if isinstance(budget, Mapping) else budget


def cell_calls(cell: Cell) -> int:
    """How many times the driver calls the op: a chain's ``steps`` or ``calls``, else 1."""
    p = cell.as_dict()
    return int(p.get("steps") or p.get("calls") or 1)


def first_estimate(cell: Cell, backend: registry.Backend) -> float:
    """Seconds the backend is expected to take on the cell, before any record of it: ``seconds_per_cell``
    for each call of the op (``cell_calls``: an interpreter pays its launch overhead every call) plus
    ``seconds_per_work`` for each unit of ``cell_work``."""
    return backend.seconds_per_cell * cell_calls(cell) + backend.seconds_per_work * cell_work(cell)


class Estimator:
    """Remaining wall time of a run, kept per backend.

    A pair's wall time (``wall_s``: dispatch to record, so the worker's start, the inputs, the
    oracle, the kernel and the check) is divided by its first estimate (the backend's cost model);
    the backend's *rate* is the exponentially smoothed ratio over its finished steady pairs.
    Compile and autotune time is counted apart: a worker's first pair of a backend (imports, first
    JIT compiles) and a pair over ``OUTLIER`` times the rate's prediction (a new shape compiled or
    autotuned) add only their time above the prediction to the backend's compile time, so one long
    JIT does not rescale every pair left. Pairs left are expected to meet compile time as often
    as the finished pairs after the first did (their compile seconds per pair). Before any steady
    pair of a backend, its rate is that of its first pairs (compile included: on a GPU every pair
    may compile or autotune, and a cost model of the kernel alone said 0 s for a 9-minute run), and
    before any pair at all 1 (the cost model). The sum is divided among the workers."""

    ALPHA = 0.3     # weight of the newest pair in the smoothed rate
    OUTLIER = 4.0   # a pair this many times its prediction is compile or autotune

    def __init__(self, pending: list[tuple[Cell, registry.Backend]], jobs: int):
        self.jobs = max(1, min(jobs, len(pending) or 1))
        self.left: Counter = Counter()            # backend -> first estimates of its pairs left
        self.n_left: Counter = Counter()          # backend -> pairs left
        self.rate: dict[str, float] = {}          # backend -> smoothed wall / first estimate
        self.compile_later_s: Counter = Counter()  # backend -> compile/autotune seconds after a worker's first pair
        self.steady_n: Counter = Counter()        # backend -> finished pairs after a worker's first
        self.first_ratio: dict[str, list[float]] = {}   # backend -> wall / estimate of first pairs
        self._first: dict[tuple[str, str], float] = {}
        for cell, b in pending:
            self._first[cell.id, b.name] = est = first_estimate(cell, b)
            self.left[b.name] += est
            self.n_left[b.name] += 1

    def _observe(self, backend: str, estimate: float, wall: float, first_in_worker: bool) -> None:
        rate = self.rate.get(backend)
        predicted = (rate if rate is not None else 1.0) * estimate
        if first_in_worker:
            self.first_ratio.setdefault(backend, []).append(wall / estimate if estimate > 0 else 1.0)
            return   # its compile time is this worker's, once; later pairs are not expected to meet it
        if rate is not None and wall > self.OUTLIER * predicted:
            self.compile_later_s[backend] += wall - predicted
            self.steady_n[backend] += 1
            return
        self.steady_n[backend] += 1
        ratio = wall / estimate if estimate > 0 else 1.0
        self.rate[backend] = ratio if rate is None else (1 - self.ALPHA) * rate + self.ALPHA * ratio

    def learn(self, cells: dict[str, Cell], backends: dict[str, registry.Backend], recs: list[dict]) -> None:
        """Calibrate from records already in the folder (on resume; records written before
        ``wall_s`` existed give their ``duration_s``)."""
        for r in recs:
            if r["id"] in cells and r["backend"] in backends and r["status"] != "skip":
                wall = r.get("wall_s", r.get("duration_s"))
                self._observe(r["backend"], first_estimate(cells[r["id"]], backends[r["backend"]]),
                              float(wall or 0.0), bool(r.get("first_in_worker")))

    def done(self, record: dict) -> None:
        est = self._first.pop((record["id"], record["backend"]), None)
        if est is None:
            return
        b = record["backend"]
        self.left[b] -= est
        self.n_left[b] -= 1
        self._observe(b, est, float(record.get("wall_s", record.get("duration_s")) or 0.0),
                      bool(record.get("first_in_worker")))

    def compile_per_pair(self, backend: str) -> float:
        """Compile/autotune seconds a pair of ``backend`` left is expected to meet."""
        n = self.steady_n[backend]
        return self.compile_later_s[backend] / n if n else 0.0

    def per_backend(self) -> dict[str, float]:
        """Backend -> seconds of its pairs left (one worker's time)."""
        out = {}
        for b, left in self.left.items():
            firsts = self.first_ratio.get(b)
            rate = self.rate.get(b, sum(firsts) / len(firsts) if firsts else 1.0)
            secs = max(0.0, left) * rate + max(0, self.n_left[b]) * self.compile_per_pair(b)
            if secs > 0:
                out[b] = secs
        return out

    def remaining(self) -> float:
        return sum(self.per_backend().values()) / self.jobs

    def compile_remaining(self) -> float:
        """The part of ``remaining`` that is expected compile and autotune time."""
        return sum(max(0, n) * self.compile_per_pair(b) for b, n in self.n_left.items()) / self.jobs


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
        compile_s = self.estimator.compile_remaining()
        eta = hms(self.estimator.remaining()) + (f" (compile/autotune {hms(compile_s)})" if compile_s >= 1 else "")
        self.line.show(self.done, f"ETA {eta} {tally}")

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
