"""The conformance runner: cells x backends, executed in worker processes.

A worker process runs one cell's backends in turn (so the cell's inputs and oracle are computed
once). If a worker dies (segfault, abort) or runs past the backend's timeout, the cell in flight
becomes a ``crash`` record, a fresh worker is started and the run goes on. Every record is
appended to ``cells.jsonl`` and flushed as it arrives; ``--resume`` skips recorded pairs.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from conformance import families, fingerprint, records, registry
from conformance.cells import Cell
from conformance.inprocess import run_one, static_record


class UsageError(ValueError):
    """A bad command-line request (unknown name, malformed filter or shard, unwritable --out)."""


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise UsageError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    return int(m.group(1)), int(m.group(2))


def select_cells(tier: str, family: str | None = None, op: str | None = None,
                 pattern: str | None = None, shard: tuple[int, int] | None = None) -> list[Cell]:
    """The tier's cells, filtered by family, op and a regular expression on the id, then sharded
    (cell i of the filtered list goes to shard i mod N)."""
    if tier not in families.TIERS:
        raise UsageError(f"unknown tier {tier!r}; known: {', '.join(families.TIERS)}")
    fams = families.families()
    if family is not None and family not in fams:
        raise UsageError(f"unknown family {family!r}; known: {', '.join(fams)}")
    if op is not None:
        known = {o for name, m in fams.items() if family in (None, name) for o in m.OPS}
        if op not in known:
            raise UsageError(f"unknown op {op!r}; known: {', '.join(sorted(known))}")
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise UsageError(f"--filter {pattern!r} is not a valid regular expression: {exc}") from None
    cells = []
    for name, mod in fams.items():
        if family is not None and name != family:
            continue
        for cell in mod.cells(tier):
            if op is not None and cell.op != op:
                continue
            if regex is not None and not regex.search(cell.id):
                continue
            cells.append(cell)
    if shard is not None:
        k, n = shard
        cells = [c for i, c in enumerate(cells) if i % n == k - 1]
    return cells


def select_backends(names: list[str] | None) -> list[registry.Backend]:
    all_ = registry.backends()
    if not names:
        return list(all_.values())
    unknown = [n for n in names if n not in all_]
    if unknown:
        raise UsageError(f"unknown backend {', '.join(unknown)}; known: {', '.join(all_)}")
    return [all_[n] for n in names]


# ---------------------------------------------------------------- worker processes

def _worker_main(conn) -> None:
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        cell, backend_name = msg
        conn.send(run_one(cell, backend_name))


class _Worker:
    def __init__(self, env: dict[str, str]):
        ctx = mp.get_context("spawn")
        self.env = env
        self.conn, child = ctx.Pipe()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()

    def death_reason(self) -> str:
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is not None and code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exited with status {code}"

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()


@dataclass
class _Slot:
    worker: _Worker | None = None
    cell: Cell | None = None
    pending: deque = field(default_factory=deque)   # backends of this cell still to run
    current: registry.Backend | None = None
    started: float = 0.0


class Progress:
    """A one-line progress bar with ETA on stderr (a line every 5% when stderr is not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr, untimed: int = 0):
        """``untimed``: records decided without running (skips), excluded from the ETA's rate."""
        self.total, self.done, self.stream = total, 0, stream
        self.untimed = untimed
        self.start = time.monotonic()
        self.counts: Counter = Counter()
        self.tty = stream.isatty()
        self._last_pct = -1

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["status"]] += 1
        elapsed = time.monotonic() - self.start
        timed = self.done - min(self.done, self.untimed)
        eta = elapsed / timed * (self.total - self.done) if timed else float("nan")
        pct = int(100 * self.done / max(self.total, 1))
        bar = "#" * (pct // 5) + "." * (20 - pct // 5)
        tally = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        line = f"[{bar}] {self.done}/{self.total} {pct:3d}% ETA {_hms(eta)} {tally}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
            if self.done == self.total:
                self.stream.write("\n")
        elif pct // 5 != self._last_pct // 5 or self.done == self.total:
            self.stream.write(line + "\n")
        self._last_pct = pct
        self.stream.flush()


def _hms(seconds: float) -> str:
    if seconds != seconds:  # no timed record yet
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _env_key(backend: registry.Backend) -> tuple:
    return tuple(sorted(backend.env.items()))


def execute(work: list[tuple[Cell, list[registry.Backend]]], jobs: int, emit) -> None:
    """Run each cell's backends in worker processes, ``jobs`` at a time; ``emit(record)`` per pair."""
    queue = deque()
    for cell, bks in work:
        by_env: dict[tuple, list] = {}
        for b in bks:
            by_env.setdefault(_env_key(b), []).append(b)
        for env, group in by_env.items():
            queue.append((env, cell, group))
    queue = deque(sorted(queue, key=lambda item: item[0]))
    slots = [_Slot() for _ in range(max(1, jobs))]
    # JAX would take 75% of a GPU's memory in every worker that touches it: workers share the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    def start_next(slot: _Slot) -> None:
        while slot.pending:
            backend = slot.pending.popleft()
            slot.current, slot.started = backend, time.monotonic()
            try:
                slot.worker.conn.send((slot.cell, backend.name))
                return
            except (OSError, BrokenPipeError):
                emit(static_record(slot.cell, backend, "crash", slot.worker.death_reason()))
                slot.worker.kill()
                slot.worker = _Worker(dict(slot.worker.env))
        slot.current = None

    def fill(slot: _Slot) -> None:
        while slot.current is None and queue:
            env, cell, group = queue.popleft()
            if slot.worker is None or _env_key_of(slot.worker) != env:
                if slot.worker is not None:
                    slot.worker.stop()
                slot.worker = _Worker(dict(env))
            slot.cell, slot.pending = cell, deque(group)
            start_next(slot)

    try:
        for slot in slots:
            fill(slot)
        while any(s.current is not None for s in slots):
            busy = [s for s in slots if s.current is not None]
            now = time.monotonic()
            timeout = min(max(0.0, s.started + s.current.timeout_s - now) for s in busy)
            handles = {s.worker.conn: s for s in busy}
            handles.update({s.worker.proc.sentinel: s for s in busy})
            ready = wait(list(handles), timeout=timeout + 0.05)
            for slot in {id(handles[h]): handles[h] for h in ready}.values():
                if slot.current is None:
                    continue
                try:
                    if not slot.worker.conn.poll():
                        raise EOFError
                    record = slot.worker.conn.recv()
                except (EOFError, OSError):
                    emit(static_record(slot.cell, slot.current, "crash", slot.worker.death_reason()))
                    slot.worker.kill()
                    slot.worker = _Worker(dict(slot.worker.env))
                else:
                    emit(record)
                start_next(slot)
                fill(slot)
            now = time.monotonic()
            for slot in slots:
                if slot.current is not None and now - slot.started > slot.current.timeout_s:
                    emit(static_record(slot.cell, slot.current, "crash",
                                       f"timeout: no result after {slot.current.timeout_s:g} s"))
                    slot.worker.kill()
                    slot.worker = _Worker(dict(slot.worker.env))
                    start_next(slot)
                    fill(slot)
    finally:
        for slot in slots:
            if slot.worker is not None:
                slot.worker.stop()


def _env_key_of(worker: _Worker) -> tuple:
    return tuple(sorted(worker.env.items()))


# ---------------------------------------------------------------- a whole run

@dataclass
class RunResult:
    counts: dict[str, Counter]
    out_dir: Path
    elapsed_s: float

    @property
    def exit_status(self) -> int:
        bad = any(c[s] for c in self.counts.values() for s in records.BAD_STATUSES)
        return 1 if bad else 0


def prepare_out(out: str | os.PathLike, resume: bool) -> tuple[Path, set]:
    """Create ``out``; on resume return the recorded (id, backend) keys. Refuses to overwrite."""
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: not writable ({exc.strerror or exc})") from None
    cells_path = out_dir / "cells.jsonl"
    if not resume:
        if cells_path.exists() and cells_path.stat().st_size > 0:
            raise UsageError(f"--out {out}: cells.jsonl already holds records; "
                             "pass --resume to continue it or choose another --out")
        return out_dir, set()
    try:
        done = {records.key(r) for r in records.read(cells_path)}
    except records.RecordsError as exc:
        raise UsageError(f"--resume: {exc}") from None
    return out_dir, done


def run(cells: list[Cell], backends: list[registry.Backend], out: str | os.PathLike, *,
        jobs: int = 1, resume: bool = False, meta: dict | None = None,
        progress_stream=sys.stderr) -> RunResult:
    """Run ``cells`` x ``backends`` into ``out``/cells.jsonl and ``out``/run.json."""
    out_dir, done = prepare_out(out, resume)
    start = time.monotonic()
    info = {**fingerprint.fingerprint(), **(meta or {}), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    old_run = out_dir / "run.json"
    if resume and old_run.exists():
        import json
        try:
            info["previous_run"] = json.loads(old_run.read_text())
        except ValueError:
            info["previous_run"] = "unreadable"
    probes = {b.name: registry.probe(b) for b in backends}
    info["backends"] = {b.name: {"available": probes[b.name][0], "reason": probes[b.name][1],
                                 "ops": {family: list(ops) for family, ops in b.ops.items()}} for b in backends}
    records.dump_json(old_run, info)

    counts: dict[str, Counter] = {b.name: Counter() for b in backends}
    writer = records.Writer(out_dir / "cells.jsonl")
    todo: list[tuple[Cell, list[registry.Backend]]] = []
    statics: list[dict] = []
    for cell in cells:
        run_here = []
        for b in backends:
            if (cell.id, b.name) in done:
                continue
            ok, why = probes[b.name]
            reason = None if ok else f"backend unavailable: {why}"
            reason = reason or b.skip_reason(cell)
            if reason is not None:
                statics.append(static_record(cell, b, "skip", reason))
            else:
                run_here.append(b)
        if run_here:
            todo.append((cell, run_here))
    total = len(statics) + sum(len(b) for _, b in todo)
    progress = Progress(total, progress_stream, untimed=len(statics))

    def emit(record: dict) -> None:
        writer.write(record)
        counts.setdefault(record["backend"], Counter())[record["status"]] += 1
        progress.update(record)

    try:
        for rec in statics:
            emit(rec)
        execute(todo, jobs, emit)
    finally:
        writer.close()
    elapsed = time.monotonic() - start
    info.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), elapsed_s=round(elapsed, 2),
                counts={k: dict(v) for k, v in counts.items()})
    records.dump_json(old_run, info)
    return RunResult(counts, out_dir, elapsed)


def summary_table(counts: dict[str, Counter]) -> str:
    """Per backend and status, as an aligned text table."""
    cols = list(records.STATUSES)
    rows = [["backend", *cols, "total"]]
    for name, c in sorted(counts.items()):
        rows.append([name, *(str(c.get(s, 0)) for s in cols), str(sum(c.values()))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
                     for r in rows)
