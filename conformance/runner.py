"""The conformance runner: cells x backends, executed in worker processes, into one run folder.

A run folder (``--out``) holds ``cells.jsonl`` (one record per pair, appended and fsynced as it
arrives), ``run.json`` (fingerprint, selection, counts, each
backend's availability and rounding model per family) and, while a run owns it, a lock file
naming the owner's pid and host. ``--resume`` continues only the selection recorded in run.json.

A worker process runs one cell's backends in turn (so the cell's inputs and oracle are computed
once). If a worker dies (segfault, abort) or runs past the timeout, the pair in flight becomes a
``crash`` record, a fresh worker is started and the run goes on. Workers of GPU backends are pinned
one per visible device; a device whose worker dies is retired and the pair retried once elsewhere.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import signal
import socket
import sys
import time
import warnings
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Mapping

from conformance import families, fingerprint, model_cells, records, registry
from conformance.cells import Cell
from conformance.errors import UsageError
from conformance.inprocess import run_one, static_record
from conformance.progress import ProgressLine

LOCK_NAME = ".kernel-lab.lock"
SELECTION_KEYS = ("tier", "family", "op", "backends", "filter", "shard", "model", "config")
MAX_WARNINGS = 20


class RunStopped(Exception):
    """The run could not go on (its records cannot be written); the records before it are valid."""


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
    """The named backends (all of them for None); an empty list is a usage error."""
    all_ = registry.backends()
    if names is None:
        return list(all_.values())
    if not names:
        raise UsageError("--backend: the list of backends is empty")
    unknown = [n for n in names if n not in all_]
    if unknown:
        raise UsageError(f"unknown backend {', '.join(unknown)}; known: {', '.join(all_)}")
    return [all_[n] for n in names]


@dataclass(frozen=True)
class Selection:
    """What a run covers; recorded in run.json so that --resume and merge can check it."""

    tier: str
    family: str | None = None
    op: str | None = None
    backends: tuple[str, ...] | None = None   # None: every registered backend
    filter: str | None = None
    shard: str | None = None                   # "K/N"
    model: str | None = None                   # also a model's cells (conformance.model_cells)
    config: str | None = None                  # ... or those of a config.json

    def as_dict(self) -> dict:
        return {"tier": self.tier, "family": self.family, "op": self.op,
                "backends": sorted(self.backends) if self.backends is not None else None,
                "filter": self.filter, "shard": self.shard, "model": self.model, "config": self.config}

    def resolve(self) -> tuple[list[Cell], list[registry.Backend]]:
        """Its cells and backends; a selection without a cell, or without a backend, is a usage error."""
        backends = select_backends(list(self.backends) if self.backends is not None else None)
        cells = select_cells(self.tier, self.family, self.op, self.filter, parse_shard(self.shard))
        try:
            cells = model_cells.extend(cells, self.model, self.config, self.family, self.op, self.filter,
                                       parse_shard(self.shard))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not cells:
            asked = ", ".join(f"{k} {v!r}" for k, v in self.as_dict().items() if v is not None and k != "backends")
            raise UsageError(f"the selection matches no cell ({asked}); `kernel-lab list-cells` shows them")
        if not any(c.op in b.ops.get(c.family, ()) for b in backends for c in cells):
            raise UsageError(f"none of the backends {', '.join(b.name for b in backends)} implements "
                             f"any of the {len(cells)} selected cells")
        return cells, backends


def selection_differences(recorded: dict, now: dict, keys=SELECTION_KEYS) -> list[str]:
    """``key: was X, now Y`` for each key of the selection that differs."""
    return [f"{k} was {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]


# ---------------------------------------------------------------- cost of a cell, ETA

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
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            record = run_one(cell, backend_name)
        if caught:
            seen = Counter(f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
                           for w in caught)
            record["warnings"] = [records.clip(f"{text} (x{n})" if n > 1 else text)
                                  for text, n in list(seen.items())[:MAX_WARNINGS]]
        conn.send(record)


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
class _Item:
    """Backends of one cell that share a worker environment (and a device, for GPU backends)."""

    cell: Cell
    backends: list[registry.Backend]
    retried_from: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.backends[0].env)

    @property
    def gpu(self) -> bool:
        return self.backends[0].uses_gpu


@dataclass
class _Slot:
    device: str | None                       # visible device id its GPU workers are pinned to
    worker: _Worker | None = None
    item: _Item | None = None
    pending: deque = field(default_factory=deque)   # backends of the item still to run
    current: registry.Backend | None = None
    started: float = 0.0


def _items(work: list[tuple[Cell, list[registry.Backend]]]) -> list[_Item]:
    out = []
    for cell, bks in work:
        groups: dict[tuple, list] = {}
        for b in bks:
            groups.setdefault((tuple(sorted(b.env.items())), b.uses_gpu), []).append(b)
        out += [_Item(cell, group) for group in groups.values()]
    return sorted(out, key=lambda it: (it.gpu, sorted(it.env.items())))


def run_in_workers(work: list[tuple[Cell, list[registry.Backend]]], jobs: int, emit, *,
                   devices: fingerprint.Devices | None = None, timeout_s: float | None = None,
                   retired: dict[str, str] | None = None) -> None:
    """Run each cell's backends in worker processes, ``jobs`` at a time; ``emit(record)`` per pair.

    ``devices``: the visible GPUs; slot i's GPU workers see only device ``i mod len(devices)``.
    ``timeout_s`` overrides each backend's own. ``retired`` receives device -> why it was retired."""
    queue = deque(_items(work))
    ids = devices.ids if devices else []
    slots = [_Slot(ids[i % len(ids)] if ids else None) for i in range(max(1, jobs))]
    retired = {} if retired is None else retired
    # JAX would take 75% of a GPU's memory in every worker that touches it: workers share the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    def label(slot: _Slot, item: _Item) -> str:
        if not item.gpu:
            return "cpu"
        return devices.label(slot.device) if slot.device is not None else "gpu"

    def limit(backend: registry.Backend) -> float:
        return timeout_s if timeout_s is not None else backend.timeout_s

    def finish(slot: _Slot, record: dict) -> None:
        record["device"] = label(slot, slot.item)
        if slot.item.retried_from is not None:
            record["retried_from"] = devices.label(slot.item.retried_from)
        emit(record)

    def can_take(slot: _Slot, item: _Item) -> bool:
        if not item.gpu or slot.device is None:
            return True
        return slot.device not in retired and slot.device != item.retried_from

    def worker_env(slot: _Slot, item: _Item) -> dict[str, str]:
        env = item.env
        if item.gpu and slot.device is not None:
            env[devices.env_var] = slot.device
        return env

    def start_next(slot: _Slot) -> None:
        while slot.pending:
            backend = slot.pending.popleft()
            slot.current, slot.started = backend, time.monotonic()
            try:
                slot.worker.conn.send((slot.item.cell, backend.name))
                return
            except (OSError, BrokenPipeError):
                died(slot, slot.worker.death_reason())
                if slot.current is not None:
                    return
        slot.current = None

    def fill(slot: _Slot) -> None:
        while slot.current is None and queue:
            item = next((it for it in queue if can_take(slot, it)), None)
            if item is None:
                return
            queue.remove(item)
            env = worker_env(slot, item)
            if slot.worker is None or slot.worker.env != env:
                if slot.worker is not None:
                    slot.worker.stop()
                slot.worker = _Worker(env)
            slot.item, slot.pending = item, deque(item.backends)
            start_next(slot)

    def elsewhere(device: str) -> bool:
        return any(s.device is not None and s.device != device and s.device not in retired for s in slots)

    def died(slot: _Slot, reason: str) -> None:
        """The worker of ``slot`` died running ``slot.current``: retire its device and retry the pair
        once elsewhere, or record a crash (and go on with a fresh worker)."""
        item, backend = slot.item, slot.current
        duration = time.monotonic() - slot.started
        slot.worker.kill()
        first_fault = item.gpu and slot.device is not None and item.retried_from is None
        if first_fault and elsewhere(slot.device):
            retired[slot.device] = f"{reason} on {item.cell.id} ({backend.name})"
            if slot.pending:
                queue.appendleft(_Item(item.cell, list(slot.pending)))
            queue.appendleft(_Item(item.cell, [backend], retried_from=slot.device))
            slot.worker, slot.pending, slot.current = None, deque(), None
            return
        if item.retried_from is not None:   # it died on a second device too: the cell, not the device
            retired.pop(item.retried_from, None)
        finish(slot, {**static_record(item.cell, backend, "crash", reason), "duration_s": duration})
        slot.worker = _Worker(dict(slot.worker.env))
        start_next(slot)

    try:
        while True:
            for slot in slots:
                if slot.current is None:
                    fill(slot)
            busy = [s for s in slots if s.current is not None]
            if not busy:
                break
            now = time.monotonic()
            timeout = min(max(0.0, s.started + limit(s.current) - now) for s in busy)
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
                    died(slot, slot.worker.death_reason())
                else:
                    finish(slot, record)
                    start_next(slot)
            now = time.monotonic()
            for slot in slots:
                if slot.current is not None and now - slot.started > limit(slot.current):
                    finish(slot, {**static_record(slot.item.cell, slot.current, "crash",
                                                  f"timeout: no result after {limit(slot.current):g} s"),
                                  "duration_s": now - slot.started})
                    slot.worker.kill()
                    slot.worker = _Worker(dict(slot.worker.env))
                    start_next(slot)
        for item in queue:   # GPU pairs left without a device to run on
            for b in item.backends:
                rec = static_record(item.cell, b, "crash", "no device left to run on: " + ", ".join(
                    f"{devices.label(d)} retired ({why})" for d, why in retired.items()))
                emit({**rec, "device": "none", **({"retried_from": devices.label(item.retried_from)}
                                                   if item.retried_from else {})})
    finally:
        for slot in slots:
            if slot.worker is not None:
                slot.worker.stop()


# ---------------------------------------------------------------- the run folder

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(out_dir: Path, warn) -> Path:
    """Take ``out_dir``'s lock file (pid, host, start time); a lock whose pid is dead on this host
    is taken over with a warning, a live one is a usage error naming its owner."""
    path = out_dir / LOCK_NAME
    host = socket.gethostname()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text())
                pid, owner_host = int(owner["pid"]), str(owner["host"])
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError):
                if path.is_dir():
                    raise UsageError(f"{path}: is a folder, expected kernel-lab's lock file") from None
                if time.time() - path.stat().st_mtime < 10:   # being written by its owner right now
                    time.sleep(1)
                    continue
                warn(f"{path}: unreadable lock file; taking it over")
                path.unlink(missing_ok=True)
                continue
            if owner_host != host:
                raise UsageError(f"--out {out_dir} is in use by pid {pid} on host {owner_host} (lock {path}); "
                                 "choose another --out, or remove the lock if that run is gone")
            if _pid_alive(pid):
                raise UsageError(f"--out {out_dir} is in use by pid {pid} on this host since "
                                 f"{owner.get('started', '?')} (lock {path}); wait for it or choose another --out")
            warn(f"{path}: stale lock of pid {pid} (no longer running); taking it over")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump({"pid": os.getpid(), "host": host, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, fh)
        return path
    raise UsageError(f"--out {out_dir}: could not take the lock {path}")


def release_lock(path: Path) -> None:
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def make_out(out: str | os.PathLike) -> Path:
    """``out`` as a writable folder (created if missing); a usage error otherwise."""
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: not writable ({exc.strerror or exc})") from None
    return out_dir


def previous_records(out_dir: Path, selection: dict, resume: bool, warn) -> tuple[list[dict], dict | None]:
    """The records already in ``out_dir`` and its run.json (on resume: same selection, or a usage
    error naming the difference). Without resume, a folder holding records is refused."""
    cells_path, run_path = out_dir / "cells.jsonl", out_dir / "run.json"
    if cells_path.is_dir():
        raise records.RecordsError(f"{cells_path}: is a folder, expected a file")
    if not resume:
        if cells_path.exists() and cells_path.stat().st_size > 0:
            raise UsageError(f"--out {out_dir}: cells.jsonl already holds records; "
                             "pass --resume to continue the same selection, or choose another --out")
        return [], None
    message = records.drop_partial_line(cells_path)
    if message:
        warn(message)
    recs = records.read(cells_path)
    if not recs and not run_path.exists():
        return [], None
    info = records.read_json(run_path)
    if "selection" not in info:
        raise UsageError(f"--resume: {run_path} records no selection (written by an older kernel-lab); "
                         "choose another --out")
    diff = selection_differences(info["selection"], selection)
    if diff:
        raise UsageError(f"--resume continues the same selection only: {'; '.join(diff)} ({run_path})")
    return recs, info


def write_run_json(path: Path, info: dict) -> None:
    """run.json, or a usage error if it is a folder, or RunStopped if it cannot be written (disk full)."""
    try:
        records.dump_json(path, info)
    except IsADirectoryError:
        raise records.RecordsError(f"{path}: is a folder, expected a file") from None
    except OSError as exc:
        raise RunStopped(f"{path}: cannot write ({exc.strerror or exc})") from None


@dataclass
class RunResult:
    counts: dict[str, Counter]
    out_dir: Path
    elapsed_s: float

    @property
    def exit_status(self) -> int:
        bad = any(c[s] for c in self.counts.values() for s in records.BAD_STATUSES)
        return 1 if bad else 0


def count(recs) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for r in recs:
        out.setdefault(r["backend"], Counter())[r["status"]] += 1
    return out


def default_jobs(backends: list[registry.Backend], devices: fingerprint.Devices) -> int:
    """One worker per visible device when a GPU backend is selected and available, else one."""
    gpu = any(b.uses_gpu and registry.probe(b)[0] for b in backends)
    return max(1, len(devices.ids)) if gpu else 1


def _say(stream, text: str) -> None:
    stream.write(f"kernel-lab: {text}\n")
    stream.flush()


def run(selection: Selection, out: str | os.PathLike, *, jobs: int | None = None, resume: bool = False,
        timeout_s: float | None = None, budget: bool = True, stream=None) -> RunResult:
    """Run the selection into ``out``/cells.jsonl and ``out``/run.json, holding the folder's lock.

    ``budget``: apply the interpreter work budget (off with ``--no-budget``; a ``--filter`` turns
    it off too). Exit status, counts and summary cover every record in the folder."""
    cells, backends = selection.resolve()
    stream = stream or sys.stderr
    out_dir = make_out(out)
    lock = acquire_lock(out_dir, lambda m: _say(stream, "warning: " + m))
    try:
        return _run_locked(selection, cells, backends, out_dir, jobs=jobs, resume=resume, timeout_s=timeout_s,
                           budget=budget and selection.filter is None, stream=stream)
    finally:
        release_lock(lock)


def _run_locked(selection, cells, backends, out_dir, *, jobs, resume, timeout_s, budget, stream):
    def say(text: str) -> None:
        _say(stream, text)

    old, old_info = previous_records(out_dir, selection.as_dict(), resume, lambda m: say("warning: " + m))
    done = {records.key(r) for r in old}
    devices = fingerprint.devices()
    jobs = jobs if jobs is not None else default_jobs(backends, devices)
    start = time.monotonic()
    run_path = out_dir / "run.json"
    info = {**fingerprint.fingerprint(), "selection": selection.as_dict(), "jobs": jobs,
            "timeout_s": timeout_s, "work_budget": budget, "devices": [devices.label(d) for d in devices.ids],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if old_info is not None:
        info["previous_run"] = old_info
    probes = {b.name: registry.probe(b) for b in backends}
    info["backends"] = {b.name: {"available": probes[b.name][0], "reason": probes[b.name][1],
                                 "ops": {family: list(ops) for family, ops in b.ops.items()}} for b in backends}
    info["rounding_models"] = {b.name: {family: b.rounding_model(family) for family in b.ops} for b in backends}
    write_run_json(run_path, info)

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
            work, limit = cell_work(cell), work_budget(cell, b)
            if reason is None and budget and limit is not None and work > limit:
                reason = (f"over the interpreter work budget ({work:,} > {limit:,.0f} tokens*heads*dims); "
                          "run with --no-budget / --filter to force")
            if reason is not None:
                statics.append(static_record(cell, b, "skip", reason))
            else:
                run_here.append(b)
        if run_here:
            todo.append((cell, run_here))
    pairs = [(c, b) for c, bks in todo for b in bks]
    estimator = Estimator(pairs, jobs)
    estimator.learn({c.id: c for c in cells}, {b.name: b for b in backends}, old)
    per = sorted(estimator.per_backend().items(), key=lambda kv: -kv[1])
    say(f"{len(cells)} cells x {len(backends)} backends -> {out_dir}: {len(pairs)} to run, {len(statics)} skip, "
        f"{len(old)} already recorded; expect about {hms(estimator.remaining())} with {jobs} worker(s)"
        + (" (" + ", ".join(f"{n} {hms(s)}" for n, s in per[:4]) + ")" if per else ""))

    all_recs = list(old)
    progress = Progress(len(statics) + len(pairs), estimator, stream)
    try:
        writer = records.Writer(out_dir / "cells.jsonl")
    except OSError as exc:
        raise UsageError(f"{out_dir / 'cells.jsonl'}: cannot be written ({exc.strerror or exc})") from None
    retired: dict[str, str] = {}

    def emit(record: dict) -> None:
        try:
            writer.write(record)
        except OSError as exc:
            raise RunStopped(f"{writer.path}: cannot write a record ({exc.strerror or exc}); the "
                             f"{len(all_recs)} records before it are valid: free space, then "
                             "continue with --resume") from None
        all_recs.append(record)
        progress.update(record)

    stopped = None
    try:
        for rec in statics:
            emit(rec)
        run_in_workers(todo, jobs, emit, devices=devices, timeout_s=timeout_s, retired=retired)
    except RunStopped as exc:
        stopped = exc
    finally:
        writer.close()
        progress.close()
    elapsed = time.monotonic() - start
    counts = count(all_recs)
    info.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), elapsed_s=round(elapsed, 2),
                counts={k: dict(v) for k, v in counts.items()}, retired_devices=retired)
    if stopped is not None:
        info["stopped"] = str(stopped)
        try:
            records.dump_json(run_path, info)
        except OSError:
            pass  # the record file's message says what to do
        raise stopped
    write_run_json(run_path, info)
    for device, why in retired.items():
        say(f"warning: device {devices.label(device)} retired: {why}")
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
