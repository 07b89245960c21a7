"""A time budget for a run (``conform --budget 5m``): which of the planned pairs fit, most
informative first, and which are left out.

The choice is greedy over the pairs' estimated seconds (``estimate.first_estimate``, plus a
worker's startup for the first pair of each backend and the cell's setup, ``estimate.setup_estimate``,
for the first pair of each cell and worker environment: ``estimate.pair_estimates``; for the second
stage the same at the rates the first ran at, ``Estimator.expected``), within ``seconds * jobs``
worker-seconds:

1. every (backend, op) gets its cheapest cell, so that each backend and each op of it runs;
2. then, per (backend, op), the cell that covers most (axis value, axis value) pairs not yet covered
   by the cells chosen for it, per second (a covering sample of the tier for slow backends, the
   interpreters: the tier is itself a covering set, and a sample of it covers most of its pairs);
3. then whatever is left, cheapest first.

A pair that does not fit is left out, never recorded: ``--resume`` without a budget runs it. The
pairs of step 1 run first, as a stage of their own, so that each backend has run when the
deadline stops a machine slower than its prices. Each stage lists its pairs in the order they were
chosen, its priority: the pool runs them in that order (``workers.items``), so that a deadline
stops the pairs chosen last. The pairs left out are ranked in the order they were refused (the
same steps: a pair that did not fit in step 1 or 2 ranks before the rest of step 3), and a worker
slot gone idle with time left takes them in that order where they fit after all (``next_late``).
"""
from __future__ import annotations

import heapq
import itertools
import re
from collections import Counter
from typing import Callable

from conformance import registry
from conformance.cells import Cell
from conformance.errors import UsageError
from conformance.run.estimate import pair_estimates

UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_seconds(text: str) -> float:
    """``"5m"``, ``"90s"``, ``"1h30m"``, ``"300"`` (seconds) as seconds; a usage error otherwise."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text or "")
    if not parts or not any(parts.groups()):
        raise UsageError(f"--budget {text!r}: expected a duration such as 5m, 90s, 1h30m or 300 (seconds)")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    seconds = 3600 * h + 60 * m + s
    if not 0 < seconds <= 7 * 24 * 3600:
        raise UsageError(f"--budget {text!r}: expected more than 0 s and at most a week")
    return seconds


def _features(cell: Cell) -> set[tuple]:
    """The (axis, value) pairs of the cell: what a covering sample covers."""
    items = sorted((k, repr(v)) for k, v in cell.as_dict().items())
    return {(a, b) for a, b in itertools.combinations(items, 2)}


def choose(pairs: list[tuple[Cell, registry.Backend]], capacity_s: float, jobs: int, machine: str | None = None,
           seconds: Callable[[Cell, registry.Backend], tuple[float, float, float]] | None = None
           ) -> tuple[list[list[tuple[Cell, registry.Backend]]], list[tuple[Cell, registry.Backend]]]:
    """(stages, left out) of ``pairs`` within ``capacity_s`` seconds of each of ``jobs`` workers:
    the chosen pairs in two stages to run one after the other, every (backend, op)'s first cell,
    then the rest chosen (so that a slow machine, stopped at the deadline, has run each backend);
    each stage in the order its pairs were chosen (steps 1 to 3 above), the left out in the order
    they were first refused (their rank for ``next_late``). ``seconds``: a pair's seconds in the parts of
    ``estimate.pair_estimates`` (pair, worker startup, cell setup), by default those at the prices
    of ``machine``'s kind (``estimate.machine_kind``); once pairs have run, the ``Estimator``'s
    ``expected``, at the rates this machine ran them."""
    left = max(0.0, capacity_s) * max(1, jobs)
    seconds = seconds or (lambda c, b: pair_estimates(c, b, machine))
    parts = {(c.id, b.name): seconds(c, b) for c, b in pairs}
    cost = {key: p[0] for key, p in parts.items()}
    taken: Counter = Counter()   # backend -> pairs chosen (the first ``jobs`` of them may each start a worker)
    chosen: dict[tuple[str, str], tuple[Cell, registry.Backend]] = {}   # in the order chosen
    set_up: set[tuple] = set()   # (cell id, worker environment) of the items chosen
    refused: dict[tuple[str, str], tuple[Cell, registry.Backend]] = {}   # in the order first refused

    def take(cell: Cell, b: registry.Backend) -> bool:
        nonlocal left
        item = cell.id, registry.worker_env(b, machine == "gpu")
        pair, startup, setup = parts[cell.id, b.name]
        price = pair + (startup if taken[b.name] < jobs else 0.0) + (setup if item not in set_up else 0.0)
        if price > left:
            refused.setdefault((cell.id, b.name), (cell, b))
            return False
        left -= price
        taken[b.name] += 1
        chosen[cell.id, b.name] = cell, b
        set_up.add(item)
        return True

    groups: dict[tuple[str, str], list[tuple[Cell, registry.Backend]]] = {}
    for c, b in pairs:
        groups.setdefault((b.name, f"{c.family}/{c.op}"), []).append((c, b))
    # 1. every (backend, op): its cheapest cell, cheapest groups first
    firsts = sorted((min(g, key=lambda p: cost[p[0].id, p[1].name]) for g in groups.values()),
                    key=lambda p: cost[p[0].id, p[1].name])
    for c, b in firsts:
        take(c, b)
    first_stage = set(chosen)
    # 2. covering: most new (axis value) pairs per second, lazily re-scored
    covered = {key: set().union(*(_features(c) for c, b in g if (c.id, b.name) in chosen)) for key, g in groups.items()}
    heap = []
    for key, g in groups.items():
        for i, (c, b) in enumerate(g):
            if (c.id, b.name) not in chosen:
                gain = len(_features(c) - covered[key])
                heapq.heappush(heap, (-gain / max(cost[c.id, b.name], 1e-3), key, i))
    while heap:
        score, key, i = heapq.heappop(heap)
        c, b = groups[key][i]
        gain = len(_features(c) - covered[key])
        if gain == 0:
            continue
        now = -gain / max(cost[c.id, b.name], 1e-3)
        if now > score + 1e-12:   # covered less since it was scored: score again
            heapq.heappush(heap, (now, key, i))
            continue
        if take(c, b):
            covered[key] |= _features(c)
    # 3. the rest, cheapest first
    for c, b in sorted(pairs, key=lambda p: cost[p[0].id, p[1].name]):
        if (c.id, b.name) not in chosen:
            take(c, b)
    stages = [[p for key, p in chosen.items() if key in first_stage],
              [p for key, p in chosen.items() if key not in first_stage]]
    return [st for st in stages if st], [p for key, p in refused.items() if key not in chosen]


def next_late(left_out: list[tuple[Cell, registry.Backend]], env: tuple | None, seen: set[str], seconds_left: float,
              seconds: Callable[[Cell, registry.Backend], tuple[float, float, float]], gpus: bool,
              can_run: Callable[[registry.Backend], bool] = lambda b: True) -> int | None:
    """The index in ``left_out`` (the pairs a time budget left out, as ``choose`` ranked them) of the
    pair a worker slot gone idle runs next, chosen late: the first that fits in ``seconds_left``
    (``seconds``: the pair's seconds in the parts of ``estimate.pair_estimates``, at the rates the
    run has learned, ``Estimator.expected``; the runner's at their 90th percentile,
    ``Estimator.pair_upper``) among those of the slot's worker environment ``env``
    (``registry.worker_env`` with ``gpus``; None: the slot has no worker), which start no worker, and
    only where none of them fits the first of any environment with its worker's startup; a backend
    in ``seen`` (those the worker has run) pays no startup again; its cell's setup is always counted.
    ``can_run``: whether the slot can run the backend. None when no pair fits. A 4m30s ``make conform``
    of the 2-core machine (2026-12-07) ran 56 to 90 pairs chosen late, Triton-interpreter pairs on the
    worker the queue ended with, and ended at 4m26s where the same command without them ended at 3m42s
    (1064 to 1098 pairs ran against 996); the deadline stopped one pair in each run (at the mean
    prediction a NumPy or Triton-interpreter pair, at the 90th percentile a NumPy or scalar-C++ one)."""
    def fits(cell: Cell, b: registry.Backend, started: bool) -> bool:
        pair, startup, setup = seconds(cell, b)
        return pair + setup + (0.0 if started and b.name in seen else startup) <= seconds_left

    same = {i for i, (c, b) in enumerate(left_out) if env is not None and registry.worker_env(b, gpus) == env}
    for started in (True, False):
        for i, (c, b) in enumerate(left_out):
            if (i in same) == started and can_run(b) and fits(c, b, started):
                return i
    return None
