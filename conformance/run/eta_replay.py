"""The ETA replayed on a finished run folder: its pairs that ran, queued as the run queued them
(``run_queue.folder_pairs``: where the records hold their ``queue_position``, in that order, the pairs
chosen late, ``chosen_late``, counted as the pairs left out until each starts, as the runner counts them; in older
folders as the local pool would have: each cell's backends of one worker environment an item run in turn
on one worker, the items of one environment together, the CPU ones first; a budgeted run's first stage, each backend and
op's cheapest cell, before the rest), dispatched to the run's workers on a simulated clock (each item to the first
worker free, each pair for its recorded ``wall_s``), and what the ``Estimator`` said every
``every`` seconds against the time that was actually left, twice: told when each pair starts (as
the runner's executors tell it), and learning from finished pairs only (an executor that does not
say when pairs start). A budgeted run's second stage begins once its first has ended, on fresh
workers, and the estimator is given its pairs then, as the runner gives it the pairs chosen
again, without the budget's deadline (``Estimator.until_deadline``: the pairs the deadline stopped
are not in the folder). A resumed folder is replayed as one uninterrupted run; pairs of cells outside the run's
tier (a model's shapes, captured inputs) are left out. Records of a run older than ``wall_s``
give their ``duration_s`` (the kernel's pair without the worker's dispatch).

    python -m conformance.run.eta_replay RUN_DIR [RUN_DIR...] [--every S] [--last S] [--prices FILE | --leave-one-out]

prints, every S seconds (default 30), the seconds actually left and each ETA with its error; the
rows of the last ``--last`` seconds (default 300) are marked, and the share of the rows from the
first minute on whose ETA was within 30% of the time left; with several RUN_DIRs, one line each
of that share (``--summary``: those lines only). ``--prices``: the prices the run was
estimated with (``git show COMMIT:conformance/run/prices.json``, COMMIT from its run.json), where
``prices.json`` has since been refitted, perhaps from this very run. ``--leave-one-out``: each RUN_DIR
estimated with prices fitted (``pricing.write_prices``) on the other RUN_DIRs, as a run of a machine
or tier the prices have not seen would be.
"""
from __future__ import annotations

import argparse
import heapq
import tempfile
from dataclasses import dataclass
from pathlib import Path

from conformance import registry
from conformance.cells import Cell
from conformance.run import estimate, pricing, run_queue
from conformance.run.estimate import Estimator, core_share, core_slowness, hms, machine_kind, use_prices


@dataclass(frozen=True)
class Sample:
    """At ``t`` seconds into the replayed run: ``left`` seconds actually left, and what the ETA said
    (``remaining`` seconds, ``eta`` as printed)."""

    t: float
    left: float
    remaining: float
    eta: str


def replay(pairs: list[tuple[Cell, registry.Backend, dict]], jobs: int, share: float = 1.0, every: float = 30.0,
           starts: bool = True, stage_sizes: list[int] | None = None, machine: str | None = None,
           slowness: float = 1.0) -> list[Sample]:
    """The ETA every ``every`` seconds of a run of ``pairs`` (cell, backend, its record with
    ``wall_s``), in the order the pool queued them, on ``jobs`` workers: consecutive pairs of one
    cell and one worker environment are an item, run in turn on the first worker free; ``starts``:
    the estimator is told when each pair starts. ``stage_sizes``: the pairs are stages of these
    sizes (a budgeted run), each begun once the one before has ended, on fresh workers, the
    estimator given the pairs left then (``Estimator.replan``, as the runner does); the pairs whose
    records say ``chosen_late`` are the pairs left out (``Estimator.leave_out``: the runner gives it
    every pair left out and counts those that fit before the deadline, which the replay does not
    have; these are the ones that fitted), each joining the pairs left as it starts (``Estimator.add``).
    ``machine``: the kind whose prices to use (``estimate.machine_kind`` of the run's GPUs, as the
    runner chose); ``slowness``: a core's there against the prices' (``estimate.core_slowness``)."""
    sizes = stage_sizes or [len(pairs)]
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    stages = [pairs[a:b] for a, b in zip(bounds, bounds[1:])]
    now = [0.0]
    planned = [[(c, b) for c, b, r in st if not r.get("chosen_late")] for st in stages]
    est = Estimator([p for st in planned for p in st], jobs, share, clock=lambda: now[0], stages=planned,
                    machine=machine, slowness=slowness)
    est.leave_out([(c, b) for c, b, r in pairs if r.get("chosen_late")])   # those the deadline let run
    events = []   # (time, 0 for an end / 1 for a new stage / 2 for a start, sequence, slot, cell, backend, record)
    begin = 0.0
    for k, stage in enumerate(stages):
        if k:
            events.append((begin, 1, len(events), None, None, None, [p for st in planned[k:] for p in st]))
        free = [(begin, i) for i in range(est.jobs)]
        for item in run_queue.items(stage, machine == "gpu"):
            t, slot = heapq.heappop(free)
            for c, b, r in item:
                end = t + _wall(r)
                events += [(t, 2, len(events), slot, c, b, r), (end, 0, len(events) + 1, slot, c, b, r)]
                t = end
            heapq.heappush(free, (t, slot))
        begin = max(t for t, _ in free)
    events.sort(key=lambda e: e[:3])
    makespan = max((e[0] for e in events), default=0.0)
    samples, i, t = [], 0, 0.0
    while t <= makespan:
        while i < len(events) and events[i][0] <= t:
            when, kind, _, slot, c, b, r = events[i]
            now[0] = when
            if kind == 0:
                est.done(r)
            elif kind == 1:
                est.replan(r)
            else:
                if r.get("chosen_late"):
                    est.add(c, b, bool(r.get("first_in_worker")))
                if starts:
                    est.began(f"slot {slot}", c.id, [b.name], when, bool(r.get("first_in_worker")))
            i += 1
        now[0] = t
        samples.append(Sample(t, makespan - t, est.remaining(), est.eta()))
        t += every
    return samples


def _wall(record: dict) -> float:
    """The pair's wall time: ``wall_s``, else (a record older than it) ``duration_s``."""
    return float(record["wall_s"] if record.get("wall_s") is not None else record["duration_s"])


def _column(s: Sample) -> str:
    """The ETA as printed and its central figure's error against the time left."""
    return f"{s.eta} ({100 * (s.remaining - s.left) / s.left:+.0f}%)" if s.left > 0 else s.eta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.run.eta_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", metavar="RUN_DIR", type=Path, nargs="+",
                   help="a finished run folder (run.json, cells.jsonl)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between rows (default 30)")
    p.add_argument("--last", type=float, default=300.0, help="the rows of this many last seconds are marked")
    p.add_argument("--prices", type=Path, help="a prices.json to estimate with (default: the lab's)")
    p.add_argument("--leave-one-out", action="store_true",
                   help="estimate each RUN_DIR with prices fitted on the other RUN_DIRs")
    p.add_argument("--summary", action="store_true", help="one line per RUN_DIR, without the rows")
    args = p.parse_args(argv)
    if args.leave_one_out and (args.prices is not None or len(args.run_dirs) < 2):
        p.error("--leave-one-out: expected two RUN_DIRs or more and no --prices")
    if args.every <= 0:
        p.error(f"--every: expected a positive number of seconds, got {args.every:g}")
    for run_dir in args.run_dirs:
        if not (run_dir / "run.json").is_file() or not (run_dir / "cells.jsonl").is_file():
            p.error(f"RUN_DIR {run_dir}: expected a run folder (run.json and cells.jsonl)")
    if args.prices is not None:
        if not args.prices.is_file():
            p.error(f"--prices {args.prices}: expected a prices.json file")
        use_prices(args.prices)
    with tempfile.TemporaryDirectory() as scratch:
        lab_prices, read = estimate.PRICES, {}   # read: each run folder read once for every fit
        try:
            for run_dir in args.run_dirs:
                if args.leave_one_out:
                    others = Path(scratch) / "prices.json"
                    pricing.write_prices(others, [d for d in args.run_dirs if d != run_dir], f"all but {run_dir}",
                                         cache=read)
                    use_prices(others)
                _print_replay(run_dir, args)
        finally:
            use_prices(lab_prices)
    return 0


def _print_replay(run_dir: Path, args: argparse.Namespace) -> None:
    """The replay of one run folder as ``main`` prints it."""
    pairs, info, sizes = run_queue.folder_pairs(run_dir)
    jobs = int(info.get("jobs") or 1)
    share, slowness = core_share(info.get("load"), jobs), core_slowness(info.get("load"))
    machine = machine_kind(info.get("gpus"))
    told, finished_only = (replay(pairs, jobs, share, args.every, starts=starts, stage_sizes=sizes, machine=machine,
                                  slowness=slowness) for starts in (True, False))
    head = f"{len(pairs)} pairs on {jobs} workers, replayed: {hms(told[0].left)}"
    counts = "within 30% from the first minute on: " + ", ".join(
        f"{name} {within(samples)}" for name, samples in (("finished pairs only", finished_only),
                                                            ("pairs in flight counted", told)))
    if args.summary or len(args.run_dirs) > 1:
        print(f"{run_dir}: {head}; {counts}")
    if args.summary:
        return
    print(head)
    print(f"{'t':>7} {'left':>7}  {'ETA, finished pairs only':<32} {'ETA, pairs in flight counted':<32}")
    for a, b in zip(finished_only, told):
        mark = "*" if a.left <= args.last else " "
        print(f"{hms(a.t):>7} {hms(a.left):>7}{mark} {_column(a):<32} {_column(b):<32}")
    print(counts)


def within(samples: list[Sample], error: float = 0.3, after_s: float = 60.0) -> str:
    """``k/n``: of the ``n`` samples from ``after_s`` on with time left, those whose ETA was within
    ``error`` of it."""
    rows = [s for s in samples if s.t >= after_s and s.left > 0]
    good = sum(abs(s.remaining - s.left) <= error * s.left for s in rows)
    return f"{good}/{len(rows)}"


if __name__ == "__main__":
    raise SystemExit(main())
