"""The ETA replayed on a finished run folder: its pairs that ran, in the order of their records,
dispatched to the run's workers on a simulated clock (each to the first worker free, for its
recorded ``wall_s``), and what the ``Estimator`` said every ``every`` seconds against the time that
was actually left, twice: told when each pair starts (as the runner's executors tell it), and
learning from finished pairs only (an executor that does not say when pairs start). A resumed
folder is replayed as one uninterrupted run; the order of dispatch is the records' order, so the
schedule is that of the run only approximately; pairs of cells outside the run's tier (a model's
shapes, captured inputs) are left out.

    python -m conformance.run.eta_replay RUN_DIR [--every S] [--last S] [--prices FILE]

prints, every S seconds (default 30), the seconds actually left and each ETA with its error; the
rows of the last ``--last`` seconds (default 300) are marked, and the share of the rows from the
first minute on whose ETA was within 30% of the time left. ``--prices``: the prices the run was
estimated with (``git show COMMIT:conformance/run/prices.json``, COMMIT from its run.json), where
``prices.json`` has since been refitted, perhaps from this very run.
"""
from __future__ import annotations

import argparse
import heapq
from dataclasses import dataclass
from pathlib import Path

from conformance import registry
from conformance.cells import Cell
from conformance.run import records
from conformance.run.estimate import Estimator, core_share, hms, use_prices
from conformance.run.selection import select_cells


@dataclass(frozen=True)
class Sample:
    """At ``t`` seconds into the replayed run: ``left`` seconds actually left, and what the ETA said
    (``remaining`` seconds, ``eta`` as printed)."""

    t: float
    left: float
    remaining: float
    eta: str


def replay(pairs: list[tuple[Cell, registry.Backend, dict]], jobs: int, share: float = 1.0, every: float = 30.0,
           starts: bool = True) -> list[Sample]:
    """The ETA every ``every`` seconds of a run of ``pairs`` (cell, backend, its record with
    ``wall_s``) on ``jobs`` workers; ``starts``: the estimator is told when each pair starts."""
    now = [0.0]
    est = Estimator([(c, b) for c, b, _ in pairs], jobs, share, clock=lambda: now[0])
    free = [(0.0, i) for i in range(est.jobs)]
    events = []   # (time, 0 for an end / 1 for a start, sequence, slot, cell, backend, record)
    for seq, (c, b, r) in enumerate(pairs):
        t, slot = heapq.heappop(free)
        end = t + float(r["wall_s"])
        events += [(t, 1, seq, slot, c, b, r), (end, 0, seq, slot, c, b, r)]
        heapq.heappush(free, (end, slot))
    events.sort(key=lambda e: e[:3])
    makespan = max((e[0] for e in events), default=0.0)
    samples, i, t = [], 0, 0.0
    while t <= makespan:
        while i < len(events) and events[i][0] <= t:
            when, kind, _, slot, c, b, r = events[i]
            now[0] = when
            if kind == 0:
                est.done(r)
            elif starts:
                est.began(f"slot {slot}", c.id, [b.name], when, bool(r.get("first_in_worker")))
            i += 1
        now[0] = t
        samples.append(Sample(t, makespan - t, est.remaining(), est.eta()))
        t += every
    return samples


def folder_pairs(run_dir: Path) -> tuple[list[tuple[Cell, registry.Backend, dict]], dict]:
    """The pairs of a run folder that ran (cell, backend, record), in record order, and its run.json."""
    info = records.read_json(run_dir / "run.json")
    cells = {c.id: c for c in select_cells(info["selection"]["tier"])}
    recs = records.read_partial(run_dir / "cells.jsonl")[0]
    known = registry.backends()
    pairs = [(cells[r["id"]], known[r["backend"]], r) for r in recs
             if r["status"] != "skip" and r.get("wall_s") is not None and r["id"] in cells and r["backend"] in known]
    return pairs, info


def _column(s: Sample) -> str:
    """The ETA as printed and its central figure's error against the time left."""
    return f"{s.eta} ({100 * (s.remaining - s.left) / s.left:+.0f}%)" if s.left > 0 else s.eta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.run.eta_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a finished run folder (run.json, cells.jsonl)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between rows (default 30)")
    p.add_argument("--last", type=float, default=300.0, help="the rows of this many last seconds are marked")
    p.add_argument("--prices", type=Path, help="a prices.json to estimate with (default: the lab's)")
    args = p.parse_args(argv)
    if args.every <= 0:
        p.error(f"--every: expected a positive number of seconds, got {args.every:g}")
    if not (args.run_dir / "run.json").is_file() or not (args.run_dir / "cells.jsonl").is_file():
        p.error(f"RUN_DIR {args.run_dir}: expected a run folder (run.json and cells.jsonl)")
    if args.prices is not None:
        if not args.prices.is_file():
            p.error(f"--prices {args.prices}: expected a prices.json file")
        use_prices(args.prices)
    pairs, info = folder_pairs(args.run_dir)
    jobs = int(info.get("jobs") or 1)
    share = core_share(info.get("load"), jobs)
    told = replay(pairs, jobs, share, args.every, starts=True)
    finished_only = replay(pairs, jobs, share, args.every, starts=False)
    print(f"{len(pairs)} pairs on {jobs} workers, replayed: {hms(told[0].left)}")
    print(f"{'t':>7} {'left':>7}  {'ETA, finished pairs only':<32} {'ETA, pairs in flight counted':<32}")
    for a, b in zip(finished_only, told):
        mark = "*" if a.left <= args.last else " "
        print(f"{hms(a.t):>7} {hms(a.left):>7}{mark} {_column(a):<32} {_column(b):<32}")
    print("within 30% from the first minute on: " + ", ".join(
        f"{name} {within(samples)}" for name, samples in (("finished pairs only", finished_only),
                                                            ("pairs in flight counted", told))))
    return 0


def within(samples: list[Sample], error: float = 0.3, after_s: float = 60.0) -> str:
    """``k/n``: of the ``n`` samples from ``after_s`` on with time left, those whose ETA was within
    ``error`` of it."""
    rows = [s for s in samples if s.t >= after_s and s.left > 0]
    good = sum(abs(s.remaining - s.left) <= error * s.left for s in rows)
    return f"{good}/{len(rows)}"


if __name__ == "__main__":
    raise SystemExit(main())
