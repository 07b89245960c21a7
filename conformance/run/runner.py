"""The conformance run: the selection's pairs planned (skips recorded at once, the rest to run),
executed by an executor (``conformance.run.executors``: this machine's pool or a cluster's slots) into
one run folder (``conformance.run.run_folder``), with the ETA (``conformance.run.estimate``) and run.json
written before and after. The runner is the only writer of the folder: the first record of each
(cell, backend) is kept, a later one is dropped and counted (``duplicates_dropped`` in run.json).

Its parts: ``selection`` (what a run covers), ``estimate`` (cost, ETA, progress), ``executors`` and
``workers`` (where pairs run), ``run_folder`` (lock, resume check, run.json), ``merge`` (shards
joined), ``counts`` (status tallies).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from conformance import fingerprint, registry
from conformance.cells import Cell
from conformance.errors import RunStopped, UsageError
from conformance.run import budget as time_budget
from conformance.run import executors, hook_answers, records, schema
from conformance.run.counts import count
from conformance.run.estimate import (Estimator, cell_work, core_share, core_slowness, hms, machine_kind, spin,
                                      start_rate, work_budget)
from conformance.run.inprocess import static_record
from conformance.run.run_folder import (
    acquire_lock,
    free_reserve,
    hold_reserve,
    make_out,
    previous_records,
    release_lock,
    write_run_json,
    write_stopped,
)
from conformance.run.progress import Progress
from conformance.run.selection import Selection
from conformance.run.workers import by_cell

NOTHING_RAN = 5   # exit status: no pair of the folder ran (every record a skip), as pytest's "no tests ran"
FINISH_S = 5.0    # of a time budget: kept for stopping the workers and writing run.json
REFRESH_S = 2.0   # the progress line is redrawn this often while pairs run, records or not
LONG_RUNNING_S = 10.0   # a pair in flight this long, the longest, is named on the progress line
CELL_ID_CHARS = 40      # of a cell id on the progress line


class BudgetSpent(Exception):
    """The run's deadline passed: no more pairs are dispatched."""


@dataclass(frozen=True)
class TimeBudget:
    """``conform --budget``: the run ends by ``deadline`` (``time.monotonic()``); ``text`` as given."""

    text: str
    seconds: float
    deadline: float


@dataclass
class RunResult:
    counts: dict[str, Counter]
    out_dir: Path
    elapsed_s: float
    left_out: dict | None = None   # run.json's left_out: what a time budget did not run

    @property
    def exit_status(self) -> int:
        """1 when a record is bad; NOTHING_RAN when every record is a skip (e.g. every selected
        backend unavailable here); else 0."""
        if any(c[s] for c in self.counts.values() for s in records.BAD_STATUSES):
            return 1
        ran = sum(n for c in self.counts.values() for s, n in c.items() if s != "skip")
        return 0 if ran else NOTHING_RAN


def _say(stream, text: str) -> None:
    stream.write(f"kernel-lab: {text}\n")
    stream.flush()


def run(selection: Selection, out: str | os.PathLike, *, executor=None, device_class: str | None = None,
        jobs: int | None = None, resume: bool = False, timeout_s: float | None = None, budget: bool = True,
        time_limit: TimeBudget | None = None, stream=None) -> RunResult:
    """Run the selection into ``out``/cells.jsonl and ``out``/run.json, holding the folder's lock.

    ``executor``: where pairs run (default: this machine's pool of ``jobs`` workers); it is
    started here and left open for the caller to close. ``device_class``: the executor's nodes of
    that class (None: its only class). ``budget``: apply the interpreter work budget (off with
    ``--no-budget``; a ``--filter`` turns it off too). ``time_limit``: run the pairs that fit it
    (``conformance.run.budget``), stop dispatching at its deadline, and list the pairs left out in
    run.json (``left_out``) and on ``stream``. Exit status, counts and summary cover every record in
    the folder."""
    cells, backends = selection.resolve()
    executor = executor or executors.LocalExecutor(jobs, timeout_s)
    executor.start(backends)
    executor.use_class(device_class)
    stream = stream or sys.stderr
    out_dir = make_out(out)
    lock = acquire_lock(out_dir, lambda m: _say(stream, "warning: " + m))
    try:
        return _run_locked(selection, cells, backends, out_dir, executor, resume=resume, timeout_s=timeout_s,
                           budget=budget and selection.filter is None, time_limit=time_limit, stream=stream)
    finally:
        release_lock(lock)


def run_each_class(selection: Selection, out: str | os.PathLike, executor, **kwargs) -> dict[str, RunResult]:
    """``run`` once per device class of ``executor`` (started here), into ``out``/<class>/, one class after another."""
    cells, backends = selection.resolve()
    executor.start(backends)
    return {cls: run(selection, Path(out) / cls, executor=executor, device_class=cls, **kwargs)
            for cls in executor.classes()}


def plan(cells: list[Cell], backends: list[registry.Backend], done: set, probes: dict, budget: bool
         ) -> tuple[list[tuple[Cell, list[registry.Backend]]], list[dict], dict[tuple[str, str], str]]:
    """The pairs not ``done`` yet: per cell the backends to run, the skip records of the rest
    (backend unavailable per ``probes``, cell not supported, over the interpreter work budget), and
    each pair's declared path. The backends' hooks are asked in workers (``hook_answers``): one that
    raises or hangs makes its pair an ``error`` record, one that ends its process a ``crash``."""
    todo: list[tuple[Cell, list[registry.Backend]]] = []
    statics: list[dict] = []
    answers = hook_answers.ask([(c, b, probes[b.name][0]) for c in cells for b in backends
                                if (c.id, b.name) not in done])
    for cell in cells:
        run_here = []
        for b in backends:
            if (cell.id, b.name) in done:
                continue
            answer = answers[(cell.id, b.name)]
            if answer.status is not None:
                statics.append(static_record(cell, b, answer.status, answer.failure, answer.path))
                continue
            ok, why = probes[b.name]
            if not ok:
                statics.append({**static_record(cell, b, "skip", f"backend unavailable: {why}", answer.path),
                                "unavailable": why})
                continue
            reason = answer.skip
            work, limit = cell_work(cell), work_budget(cell, b)
            if reason is None and budget and limit is not None and work > limit:
                reason = (f"over the interpreter work budget ({work:,} > {limit:,.0f} tokens*heads*dims); "
                          "run with --no-budget / --filter to force")
            if reason is not None:
                statics.append(static_record(cell, b, "skip", reason, answer.path))
            else:
                run_here.append(b)
        if run_here:
            todo.append((cell, run_here))
    return todo, statics, {key: a.path for key, a in answers.items()}


def _left_out(pairs: list[tuple[Cell, registry.Backend]], time_limit: TimeBudget, why: str, late: int = 0) -> dict:
    """run.json's ``left_out``: the pairs a time budget did not run, per backend and each of them (in the
    order ``budget.choose`` ranked them), and how many pairs it left out at first ran, chosen late
    (``late``: ``budget.next_late``)."""
    per = Counter(b.name for _, b in pairs)
    return {"budget": time_limit.text, "why": why, "pairs": len(pairs), "per_backend": dict(per.most_common()),
            "ids": [[c.id, b.name] for c, b in pairs], "chosen_late": late}


def _choose_again(stage, left_out: list, time_limit: TimeBudget, estimator: Estimator, progress: Progress,
                  jobs: int) -> list[tuple[Cell, list[registry.Backend]]]:
    """The second stage of a time budget, chosen again from its pairs and those left out with the
    time left and each pair's seconds as the estimator expects them after the first stage
    (``Estimator.expected``: each backend at the rate it ran, one not run yet at the machine's),
    then again in the time left over the upper margin of the pairs so chosen
    (``Estimator.upper_margin``: their 90th percentile, each backend's rate resting on the few pairs
    the first stage ran), so that the deadline stops few of them; what that margin leaves idle, slots
    fill with pairs chosen late (``budget.next_late``) as their queue runs dry.
    A single machine-wide rate underrates the slow backends: replayed on a 4m30s ``make conform`` of
    the 2-core machine (2026-12-06) it put the second stage's pairs that ran at 364 s where they took
    438 (Triton-interpreter backends at 2 to 2.6 times their share), and the deadline stopped 133 pairs
    chosen; the backends' own rates put them at 530 s. ``left_out`` is updated in place."""
    rest = [(c, b) for c, bks in stage for b in bks] + left_out
    capacity = time_limit.deadline - time.monotonic() - FINISH_S
    chosen, left = time_budget.choose(rest, capacity, jobs, estimator.machine, estimator.expected)
    margin = estimator.upper_margin([p for st in chosen for p in st])
    if margin > 1.0:
        chosen, left = time_budget.choose(rest, capacity / margin, jobs, estimator.machine, estimator.expected)
    left_out[:] = left
    pairs = [p for st in chosen for p in st]
    estimator.replan(pairs)
    estimator.leave_out(left)
    progress.total = progress.done + estimator.work_left()
    return by_cell(pairs)


@contextlib.contextmanager
def _refreshing(redraw, every: float):
    """Call ``redraw()`` every ``every`` seconds from a thread of its own while the block runs."""
    stop = threading.Event()

    def loop():
        while not stop.wait(every):
            redraw()

    thread = threading.Thread(target=loop, name="kernel-lab-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def running_text(estimator: Estimator) -> str:
    """``longest running: <backend> <cell id> 2m10s`` for the pairs in flight the longest, once they
    have run ``LONG_RUNNING_S`` (why the ETA grows while no record comes); else empty."""
    longest = estimator.longest_running()
    if longest is None or longest[1] < LONG_RUNNING_S:
        return ""
    r, elapsed = longest
    cell = r.cell_id if len(r.cell_id) <= CELL_ID_CHARS else r.cell_id[:CELL_ID_CHARS - 3] + "..."
    return f"longest running: {'+'.join(r.backends)} {cell} {hms(elapsed)}"


def _run_locked(selection, cells, backends, out_dir, executor, *, resume, timeout_s, budget, time_limit, stream):
    def say(text: str) -> None:
        _say(stream, text)

    old, old_info = previous_records(out_dir, selection.as_dict(), resume, lambda m: say("warning: " + m))
    done = {records.key(r) for r in old}
    jobs = executor.jobs
    start = time.monotonic()
    run_path = out_dir / "run.json"
    # a resumed folder of an older version keeps its records as they are: it stays that version
    version = schema.version(old_info) if old_info is not None else schema.VERSION
    info = {"schema": version, **fingerprint.fingerprint(), "selection": selection.as_dict(), "jobs": jobs,
            "timeout_s": timeout_s, "work_budget": budget, **executor.info(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if old_info is not None:
        # the runs before, a flat list (run.json is read to a limited depth); their nodes' fingerprints left out
        info["previous_runs"] = [*old_info.get("previous_runs", []),
                                 {k: v for k, v in old_info.items() if k not in ("nodes", "previous_runs")}]
    if executor.name == "local":   # this machine's load before the run's own work: the ETA's first guess
        info["load"] = {**fingerprint.load_now(), **spin()}
    share, slowness = core_share(info.get("load"), jobs), core_slowness(info.get("load"))
    machine = machine_kind(info["gpus"])
    probes = executor.probes(backends)
    info["backends"] = {b.name: {"available": probes[b.name][0], "reason": probes[b.name][1],
                                 "ops": {family: list(ops) for family, ops in b.ops.items()}} for b in backends}
    info["rounding_models"] = {b.name: {family: b.rounding_model(family) for family in b.ops} for b in backends}
    write_run_json(run_path, info)
    try:
        hold_reserve(out_dir)
    except RunStopped as exc:
        write_stopped(run_path, info, exc)
        raise

    todo, statics, declared = plan(cells, backends, done, probes, budget)
    pairs = [(c, b) for c, bks in todo for b in bks]
    left_out: list[tuple[Cell, registry.Backend]] = []
    stages = [todo]
    if time_limit is not None:
        chosen, left_out = time_budget.choose(
            pairs, (time_limit.deadline - time.monotonic() - FINISH_S) / start_rate(share, slowness), jobs, machine)
        # the first stage (each backend and op), then the rest, chosen again once the first has run
        stages = [by_cell(chosen[0] if chosen else []), by_cell([p for st in chosen[1:] for p in st])]
        pairs = [p for stage in chosen for p in stage]
        info["left_out"] = _left_out(left_out, time_limit, "did not fit the budget")
        write_run_json(run_path, info)
    estimator = Estimator(pairs, jobs, share, stages=[[(c, b) for c, bks in st for b in bks] for st in stages],
                          machine=machine, deadline=time_limit.deadline if time_limit is not None else None,
                          slowness=slowness)
    estimator.learn({c.id: c for c in cells}, {b.name: b for b in backends}, old)
    estimator.leave_out(left_out)   # what slots gone idle take before the deadline counts in the ETA
    per = sorted(estimator.per_backend().items(), key=lambda kv: -kv[1])
    say(f"{len(cells)} cells x {len(backends)} backends -> {out_dir}: {len(pairs)} to run, {len(statics)} skip, "
        f"{len(old)} already recorded"
        + (f", {len(left_out)} left out by --budget {time_limit.text}" if time_limit is not None else "")
        + f"; expect {estimator.eta()} with {jobs} worker(s)"
        + (" (" + ", ".join(f"{n} {hms(s)}" for n, s in per[:4]) + ")" if per else ""))

    all_recs = list(old)
    progress = Progress(estimator.total, stream)
    tally: Counter = Counter()
    try:
        writer = records.Writer(out_dir / "cells.jsonl")
    except OSError as exc:
        raise UsageError(f"{out_dir / 'cells.jsonl'}: cannot be written ({exc.strerror or exc})") from None
    seen = set(done)
    dropped = 0
    lock = threading.Lock()   # the estimator and the progress line, shared with the refreshing thread
    # each pair's place in the run's queue, the order it was sent to a slot (after a resumed folder's), and the slot
    queued: dict[tuple[str, str], tuple[int, str]] = {}
    next_position = 1 + max((r.get("queue_position", -1) for r in old), default=-1)
    late: set[tuple[str, str]] = set()   # pairs chosen late

    def emit(record: dict) -> None:
        nonlocal dropped
        if record["status"] == "crash" and records.key(record) in declared:
            record = {**record, "path": declared[records.key(record)]}   # the worker died before saying
        if records.key(record) in seen:
            dropped += 1
            return
        seen.add(records.key(record))
        if records.key(record) in queued:
            position, slot = queued[records.key(record)]
            record = {**record, "queue_position": position, "slot": slot,
                      **({"chosen_late": True} if records.key(record) in late else {})}
        try:
            writer.write(record)
        except OSError as exc:
            raise RunStopped(f"{writer.path}: cannot write a record ({exc.strerror or exc}); the "
                             f"{len(all_recs)} records before it are valid: free space, then "
                             "continue with --resume") from None
        all_recs.append(record)
        written = len(seen) - len(done)
        with lock:
            tally[record["status"]] += 1
            weight = estimator.done(record)
            progress.advance(weight, line(), finished=written >= len(statics) + len(pairs))
        if time_limit is not None and time.monotonic() > time_limit.deadline - FINISH_S:
            raise BudgetSpent

    def line() -> str:
        written = len(seen) - len(done)
        running = running_text(estimator)
        text = (f"{max(0, written - len(statics))}/{len(pairs)} pairs ETA {estimator.eta()} "
                + " ".join(f"{k}={v}" for k, v in sorted(tally.items())))
        return text.rstrip() + (f"; {running}" if running else "")

    def began(slot: str, cell: Cell, backend_names: list[str], since: float, first_in_worker: bool | None) -> None:
        nonlocal next_position
        with lock:
            estimator.began(slot, cell.id, backend_names, since, first_in_worker)
            for name in backend_names:
                queued[cell.id, name] = next_position, slot
                next_position += 1

    def more(env: tuple | None, worker_seen: set[str], can_run) -> tuple[Cell, registry.Backend] | None:
        """A pair the budget left out, chosen late for a slot gone idle (``budget.next_late``) where its
        prediction, at the 90th percentile of a pair's time (``Estimator.pair_upper``), fits before the
        deadline; it joins the pairs to run."""
        with lock:
            upper = estimator.pair_upper()
            i = time_budget.next_late(left_out, env, worker_seen, time_limit.deadline - FINISH_S - time.monotonic(),
                                      lambda c, b: tuple(upper * s for s in estimator.expected(c, b)),
                                      machine == "gpu", can_run)
            if i is None:
                return None
            cell, b = left_out.pop(i)
            pairs.append((cell, b))
            late.add((cell.id, b.name))
            estimator.add(cell, b, first_in_worker=registry.worker_env(b, machine == "gpu") != env
                          or b.name not in worker_seen)
            progress.grow(progress.done + estimator.work_left())
        return cell, b

    def refresh() -> None:
        with lock:
            progress.refresh(line())

    stopped, why = None, "did not fit the budget"
    try:
        for rec in statics:
            emit(rec)
        for i, stage in enumerate(stages):
            if i == 1:   # the rest chosen again at this machine's speed, measured on the first stage
                stage = _choose_again(stage, left_out, time_limit, estimator, progress, jobs)
                pairs = [(c, b) for c, bks in stages[0] + stage for b in bks]
            if time_limit is not None:
                info.setdefault("stage_starts", []).append(next_position)
            with _refreshing(refresh, REFRESH_S):
                # the last stage of a budgeted run: a slot gone idle takes pairs left out that fit after all
                executor.run(stage, emit, began, more if time_limit is not None and i == len(stages) - 1 else None)
    except RunStopped as exc:
        stopped = exc
    except BudgetSpent:
        unfinished = [(c, b) for c, b in pairs if (c.id, b.name) not in seen]
        left_out += unfinished
        why += f" ({len(unfinished)} of them not finished when it ran out)"
    finally:
        writer.close()
        progress.close()
    if time_limit is not None:
        info["left_out"] = _left_out(left_out, time_limit, why, len(late & seen))
    elapsed = time.monotonic() - start
    counts = count(all_recs)
    info.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), elapsed_s=round(elapsed, 2),
                counts={k: dict(v) for k, v in counts.items()}, retired_devices=executor.retired,
                duplicates_dropped=dropped)
    free_reserve(out_dir)   # the room run.json needs on a full disk
    if stopped is not None:
        write_stopped(run_path, info, stopped)
        raise stopped
    write_run_json(run_path, info)
    for slot, why in executor.retired.items():
        say(f"warning: {executor.slot_name(slot)} retired: {why}")
    if dropped:
        say(f"warning: {dropped} late duplicate record(s) dropped (the first record of each pair is kept)")
    return RunResult(counts, out_dir, elapsed, left_out=info.get("left_out"))
