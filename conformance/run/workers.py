"""The local pool: (cell, backend) pairs run in worker processes on this machine.

A worker process runs one cell's backends in turn (so the cell's inputs and oracle are computed
once). If a worker dies (segfault, abort) or runs past the timeout, the pair in flight becomes a
``crash`` record, a fresh worker is started and the pool goes on. Workers of GPU backends are
pinned one per visible device; a device whose worker dies is retired and the pair retried once
elsewhere. ``LocalPool.run(work, emit, began, more)`` is what an executor provides: ``emit(record)`` once per
pair, as each finishes, ``began(slot, cell, [backend name], since, first_in_worker)`` as each is sent
to its worker (a pair retried elsewhere begins again), and ``more(env, seen, can_run)`` asked for a
pair chosen late, (cell, backend) or None, each time a slot has nothing left in the queue to take.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from conformance import fingerprint, registry
from conformance.cells import Cell
from conformance.run import gpu_sanitizer, records, spawn
from conformance.run.inprocess import run_one, static_record

MAX_WARNINGS = 20


def _die_with_parent(parent: int) -> None:
    """On Linux, have the kernel kill this process when the one that started it dies (kill -9
    included): a worker running a long kernel never outlives its runner or its Ray slot."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # it died before the call
        os._exit(1)


def _worker_main(conn, output: str, parent: int) -> None:
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the runner stops the workers and says what is kept
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(output, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)    # what the backend prints goes to the record, not the console
    os.dup2(fd, 2)
    cpu_before = 0.0   # the first pair's CPU time counts the worker's start, as its wall time does
    for cell, backend_name in spawn.messages(conn):
        os.ftruncate(fd, 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            record = run_one(cell, backend_name)
        sys.stdout.flush()
        sys.stderr.flush()
        printed = _printed(output)
        if printed:
            record["output"] = printed
        report = gpu_sanitizer.report_in(printed)
        if report and record["status"] not in ("error", "crash"):
            record.update(status="error", reason=f"compute-sanitizer: {report} (the check said {record['status']}"
                                                 f"{': ' + record['reason'] if record.get('reason') else ''})")
        record["cpu_s"] = time.process_time() - cpu_before   # this process's threads, idle time ~0
        cpu_before = time.process_time()
        if caught:
            seen = Counter(f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
                           for w in caught)
            record["warnings"] = [records.clip(f"{text} (x{n})" if n > 1 else text)
                                  for text, n in list(seen.items())[:MAX_WARNINGS]]
        conn.send(record)


def _printed(path: str) -> str:
    """What a worker printed while running its current pair (its start, cut to ``MAX_TEXT``)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(4 * records.MAX_TEXT)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return records.clip(text + ("" if size <= len(data) else f" [... {size - len(data)} more bytes printed]"))


class Worker:
    """One spawned worker process with ``env`` set, and the pipe to it; what it prints goes to the
    file ``output`` (read into the pair's record), never to the console."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        fd, self.output = tempfile.mkstemp(prefix="kernel-lab-worker-", suffix=".out")
        os.close(fd)
        self.proc, self.conn = spawn.start(_worker_main, (self.output, os.getpid()), env)

    def death_reason(self) -> str:
        return f"worker died ({spawn.how_ended(self.proc)})"

    def printed(self) -> str:
        return _printed(self.output)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()
        Path(self.output).unlink(missing_ok=True)

    def stop(self) -> None:
        spawn.stop(self.proc, self.conn)
        Path(self.output).unlink(missing_ok=True)


@dataclass
class Item:
    """Backends of one cell that share a worker environment (``registry.worker_env``; ``gpu``: they run
    on a device)."""

    cell: Cell
    backends: list[registry.Backend]
    gpu: bool = False
    retried_from: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.backends[0].env)


@dataclass
class Slot:
    """One place in the pool: its device, its worker, the item it runs and the pair in flight."""

    device: str | None                       # visible device id its GPU workers are pinned to
    worker: Worker | None = None
    item: Item | None = None
    pending: deque = field(default_factory=deque)   # backends of the item still to run
    current: registry.Backend | None = None
    started: float = 0.0
    seen: set = field(default_factory=set)          # backends its current worker has run


def by_cell(pairs: list[tuple[Cell, registry.Backend]]) -> list[tuple[Cell, list[registry.Backend]]]:
    """Pairs as (cell, its backends), cells in first-seen order: the work ``items`` groups."""
    out: dict[str, tuple[Cell, list]] = {}
    for c, b in pairs:
        out.setdefault(c.id, (c, []))[1].append(b)
    return list(out.values())


def items(work: list[tuple[Cell, list[registry.Backend]]], gpus: bool) -> list[Item]:
    """Each cell's backends grouped by worker environment (``registry.worker_env`` where the pool
    has GPUs or not: ``gpus``), in the order of ``work`` within each environment (``by_environment``)."""
    out = []
    for cell, bks in work:
        groups: dict[tuple, list] = {}
        for b in bks:
            groups.setdefault(registry.worker_env(b, gpus), []).append(b)
        out += [Item(cell, group, gpu=env[1]) for env, group in groups.items()]
    return by_environment(out, gpus)


def by_environment(queue: list, gpus: bool) -> list:
    """The items of ``queue`` (a budgeted stage's in the order its pairs were chosen, their priority)
    grouped by worker environment (``registry.worker_env`` of the item's backends, ``gpus`` as there),
    each group in the queue's order, the CPU groups
    before the GPU ones (on a GPU machine the long CPU chains start first: the 14-worker H200 chains
    run replayed 4m01s so, 4m44s with a GPU group first), each kind in the order of the first item
    each group holds: a slot starts a worker once per environment, as it did with the groups in a
    fixed order, and a deadline stops the items of the environment whose best item was chosen last,
    last first. Items in strict priority order would start a worker at each
    change of environment: the second stages of three saved budgeted runs of the 2-core machine,
    replayed with their pairs' recorded times and 3 s a worker start (2026-12-06), took 217 to 249
    starts against 6, and 1.5 to 2.8 times as long."""
    first: dict = {}
    for it in queue:
        first.setdefault(registry.worker_env(it.backends[0], gpus), len(first))
    return sorted(queue, key=lambda it: (it.gpu, first[registry.worker_env(it.backends[0], gpus)]))


class LocalPool:
    """``jobs`` worker slots; slot i's GPU workers see only device ``i mod len(devices)``.

    ``timeout_s`` overrides each backend's own. After ``run``, ``retired`` maps each retired
    device to why it was retired. ``keep_workers``: the workers outlive ``run`` (for the next
    ``run``) until ``close``."""

    def __init__(self, jobs: int, *, devices: fingerprint.Devices | None = None, timeout_s: float | None = None,
                 keep_workers: bool = False):
        ids = devices.ids if devices else []
        self.devices, self.timeout_s, self.keep_workers = devices, timeout_s, keep_workers
        self.slots = [Slot(ids[i % len(ids)] if ids else None) for i in range(max(1, jobs))]
        self.retired: dict[str, str] = {}
        self.queue: deque[Item] = deque()
        self.emit = None
        self.began = None
        self.more = None

    @property
    def gpus(self) -> bool:
        """The pool's slots are pinned to devices (``registry.worker_env`` where there are GPUs)."""
        return self.slots[0].device is not None

    def run(self, work: list[tuple[Cell, list[registry.Backend]]], emit, began=None, more=None) -> None:
        """Run each cell's backends; ``emit(record)`` per pair (an exception from it stops the pool),
        ``began(slot, cell, [backend name], since, first_in_worker)`` as each pair is sent (``slot``:
        ``"slot <i>"``, ``since``: ``time.monotonic()``). ``more(env, seen, can_run)``: asked each time a
        slot finds nothing in the queue it can take, for one more pair to run there, (cell, backend),
        or None; ``env``: the slot's worker environment (``registry.worker_env``; None: no worker),
        ``seen``: the backends that worker has run, ``can_run(backend)``: whether the slot can run it."""
        self.queue, self.emit, self.began, self.more = deque(items(work, gpus=self.gpus)), emit, began, more
        # JAX would take 75% of a GPU's memory in every worker that touches it: workers share the GPU.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            while self._step():
                pass
            self._no_device_left()
        except BaseException:
            self.close()
            raise
        if not self.keep_workers:
            self.close()

    def close(self) -> None:
        """Stop every worker; one with a pair in flight (the run was stopped: its record would never be
        read) is killed at once, not waited for (``spawn.stop`` waits 5 s for a worker to read its stop:
        a time budget's deadline that stopped a pair in flight on each of 2 slots held the command 10 s
        past it)."""
        for slot in self.slots:
            if slot.worker is not None:
                if slot.current is not None:
                    slot.worker.kill()
                else:
                    slot.worker.stop()
                slot.worker = None

    def _step(self) -> bool:
        """Start what can start, wait for a result, a death or a timeout; False when all is done."""
        for slot in self.slots:
            if slot.current is None:
                self._fill(slot)
        busy = [s for s in self.slots if s.current is not None]
        if not busy:
            return False
        now = time.monotonic()
        timeout = min(max(0.0, s.started + self._limit(s.current) - now) for s in busy)
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
                self._died(slot, slot.worker.death_reason())
            else:
                self._finish(slot, record)
                self._start_next(slot)
        now = time.monotonic()
        for slot in self.slots:
            if slot.current is not None and now - slot.started > self._limit(slot.current):
                limit = self._limit(slot.current)
                printed = slot.worker.printed()
                self._finish(slot, {**static_record(slot.item.cell, slot.current, "crash",
                                                    f"timeout: no result after {limit:g} s"),
                                    "duration_s": now - slot.started, **({"output": printed} if printed else {})})
                slot.worker.kill()
                self._new_worker(slot, dict(slot.worker.env))
                self._start_next(slot)
        return True

    def _no_device_left(self) -> None:
        """GPU pairs left in the queue once every device that could take them is retired."""
        for item in self.queue:
            for b in item.backends:
                rec = static_record(item.cell, b, "crash", "no device left to run on: " + ", ".join(
                    f"{self.devices.label(d)} retired ({why})" for d, why in self.retired.items()))
                self.emit({**rec, "device": "none", **({"retried_from": self.devices.label(item.retried_from)}
                                                        if item.retried_from else {})})

    def _limit(self, backend: registry.Backend) -> float:
        return self.timeout_s if self.timeout_s is not None else backend.timeout_s

    def _label(self, slot: Slot, item: Item) -> str:
        return self.devices.label(slot.device) if item.gpu else "cpu"

    def _finish(self, slot: Slot, record: dict) -> None:
        # the pair's wall time, dispatch to record (worker start, inputs, oracle, kernel, check), and
        # whether it was this worker's first pair of the backend (imports, first JIT compiles)
        record["wall_s"] = time.monotonic() - slot.started
        record["first_in_worker"] = slot.current.name not in slot.seen
        slot.seen.add(slot.current.name)
        record["device"] = self._label(slot, slot.item)
        if slot.item.retried_from is not None:
            record["retried_from"] = self.devices.label(slot.item.retried_from)
        self.emit(record)

    def _can_take(self, slot: Slot, item: Item) -> bool:
        return self._can_run(slot, item.gpu) and not (item.gpu and slot.device == item.retried_from)

    def _can_run(self, slot: Slot, gpu: bool) -> bool:
        """Whether ``slot`` can run an item on a GPU (``gpu``) or not: not on a retired device."""
        return not gpu or slot.device not in self.retired

    def _worker_env(self, slot: Slot, item: Item) -> dict[str, str]:
        env = item.env
        if item.gpu:
            # Triton's autotuner keeps its results on disk: the workers of a run (several per GPU
            # with --jobs) and later runs reuse them instead of timing every config again
            env.setdefault("TRITON_CACHE_AUTOTUNING", os.environ.get("TRITON_CACHE_AUTOTUNING", "1"))
        if item.gpu:
            env[self.devices.env_var] = slot.device
        return env

    def _start_next(self, slot: Slot) -> None:
        while slot.pending:
            backend = slot.pending.popleft()
            slot.current, slot.started = backend, time.monotonic()
            try:
                slot.worker.conn.send((slot.item.cell, backend.name))
            except (OSError, BrokenPipeError):
                self._died(slot, slot.worker.death_reason())
                if slot.current is not None:
                    return
                continue
            if self.began is not None:
                self.began(f"slot {self.slots.index(slot)}", slot.item.cell, [backend.name], slot.started,
                           backend.name not in slot.seen)
            return
        slot.current = None

    @staticmethod
    def _new_worker(slot: Slot, env: dict[str, str]) -> None:
        slot.worker = Worker(env)
        slot.seen.clear()

    def _fill(self, slot: Slot) -> None:
        while slot.current is None:
            item = next((it for it in self.queue if self._can_take(slot, it)), None) or self._asked(slot)
            if item is None:
                return
            self.queue.remove(item)
            env = self._worker_env(slot, item)
            if slot.worker is None or slot.worker.env != env:
                if slot.worker is not None:
                    slot.worker.stop()
                self._new_worker(slot, env)
            slot.item, slot.pending = item, deque(item.backends)
            self._start_next(slot)

    def _asked(self, slot: Slot) -> Item | None:
        """The pair ``more`` gives ``slot``, queued as an item of its own (None: no ``more``, or none given)."""
        if self.more is None:
            return None
        env = registry.worker_env(slot.item.backends[0], self.gpus) if slot.worker and slot.item else None
        late = self.more(env, set(slot.seen), lambda b: self._can_run(slot, registry.worker_env(b, self.gpus)[1]))
        if late is None:
            return None
        cell, backend = late
        self.queue.append(Item(cell, [backend], gpu=registry.worker_env(backend, self.gpus)[1]))
        return self.queue[-1]

    def _elsewhere(self, device: str) -> bool:
        return any(s.device is not None and s.device != device and s.device not in self.retired
                   for s in self.slots)

    def _died(self, slot: Slot, reason: str) -> None:
        """The worker of ``slot`` died running ``slot.current``: retire its device and retry the pair
        once elsewhere, or record a crash (and go on with a fresh worker)."""
        item, backend = slot.item, slot.current
        duration = time.monotonic() - slot.started
        printed = slot.worker.printed()
        slot.worker.kill()
        first_fault = item.gpu and slot.device is not None and item.retried_from is None
        if first_fault and self._elsewhere(slot.device):
            self.retired[slot.device] = f"{reason} on {item.cell.id} ({backend.name})"
            if slot.pending:
                self.queue.appendleft(Item(item.cell, list(slot.pending), gpu=True))
            self.queue.appendleft(Item(item.cell, [backend], gpu=True, retried_from=slot.device))
            slot.worker, slot.pending, slot.current = None, deque(), None
            slot.seen.clear()
            return
        if item.retried_from is not None:   # it died on a second device too: the cell, not the device
            self.retired.pop(item.retried_from, None)
        self._finish(slot, {**static_record(item.cell, backend, "crash", reason), "duration_s": duration,
                            **({"output": printed} if printed else {})})
        self._new_worker(slot, dict(slot.worker.env))
        self._start_next(slot)
