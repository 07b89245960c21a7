"""Backend probes in worker processes with a time limit: ``available()`` that hangs, raises or kills
its process makes the backend unavailable with the reason, never the caller stuck or dead.

A worker (spawned with the backend's ``env``, e.g. ``TRITON_INTERPRET=1``) answers one backend at a
time: ``available()``, then, for a backend with ``probe_call=True``, one tiny call of its kernels
(``run`` on its smallest supported cell of the ci tier; only an exception counts, the values are
the matrix's business), so a stack that imports but cannot run (an interpreter broken by the NumPy
it finds) says so before the run. Reasons name the versions of the packages the probe imported.
Backends that share an environment share a worker; one that hangs or dies gets a fresh worker for
the rest.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor

from conformance import registry
from conformance.run import spawn

VERSIONED = ("numpy", "torch", "triton", "jax", "flydsl", "vllm", "fla")


def _versions() -> str:
    found = []
    for name in VERSIONED:
        mod = sys.modules.get(name)
        if mod is not None:
            found.append(f"{name} {getattr(mod, '__version__', '?')}")
    return ", ".join(found)


def _hook_error(what: str, exc: BaseException) -> str:
    """``what`` raised ``exc``, at the line that failed: the innermost frame of the first exception of its
    ``raise ... from`` chain (a wrapper's re-raise, as the Triton interpreter's InterpreterError, names the
    kernel line below it)."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    frames = [f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(root.__traceback__)]
    at = ""
    if frames:
        at = f" at {frames[-1]}" + (f" (called from {frames[-2]})" if root is not exc and len(frames) > 1 else "")
    return f"{what} raised {type(exc).__name__}: {exc}{at}"


def tiny_call(backend: registry.Backend) -> None:
    """``backend.run`` on its smallest supported ci-tier cell (a decode when it has one)."""
    from conformance import families
    from conformance.run.estimate import cell_work

    for family, ops in backend.ops.items():
        fam = families.get(family)
        op = "decode" if "decode" in ops else ops[0]
        cells = [c for c in fam.cells("ci") if c.op == op and backend.skip_reason(c) is None]
        if cells:
            cell = min(cells, key=cell_work)
            backend.run(cell, fam.make_inputs(cell))
            return


def answer(backend: registry.Backend) -> tuple[bool, str]:
    """The probe of one backend in this process: (available, reason with versions)."""
    try:
        ok, reason = backend.available()
        ok, reason = bool(ok), str(reason)
    except Exception as exc:
        return False, _hook_error("available()", exc)
    if ok and backend.probe_call:
        try:
            tiny_call(backend)
        except Exception as exc:
            return False, f"a tiny call of its kernels fails here ({_versions()}): {_hook_error('run', exc)}"
    return ok, reason


def _worker_main(conn) -> None:
    for name in spawn.messages(conn):
        backend = registry.backends().get(name)
        with warnings.catch_warnings():   # the console stays clean, as in the run's workers
            warnings.simplefilter("ignore")
            conn.send(None if backend is None else answer(backend))


class _Worker:
    def __init__(self, env: dict[str, str]):
        self.proc, self.conn = spawn.start(_worker_main, (), env)

    def ask(self, backend: registry.Backend) -> tuple[bool, str] | None:
        """The worker's answer, or an 'unavailable' reason when it hangs or dies; None when the
        backend is not registered in a fresh process (registered at run time by the caller)."""
        try:
            self.conn.send(backend.name)
        except OSError:
            pass  # died already: its exit status says how
        if self.conn.poll(backend.probe_timeout_s):
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                pass
        else:
            self.kill()
            return False, (f"the probe (available(){' and a tiny call' if backend.probe_call else ''}) did not "
                           f"answer within {backend.probe_timeout_s:g} s; killed")
        return False, f"the probe process died ({spawn.how_ended(self.proc)}) in available(){' or a tiny call' if backend.probe_call else ''}"

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)

    def stop(self) -> None:
        spawn.stop(self.proc, self.conn)


def _probe_group(env: tuple, queue: list[registry.Backend], tick, lock: threading.Lock) -> dict:
    """{name: (available, reason)} of the backends of one environment, in one worker (a fresh one
    after a hang or a death)."""
    out: dict[str, tuple[bool, str]] = {}
    worker = None
    for b in queue:
        if worker is None or not worker.alive():
            worker = _Worker(dict(env))
        got = worker.ask(b)
        out[b.name] = answer(b) if got is None else got
        if tick is not None:
            with lock:
                tick(b.name)
    if worker is not None:
        worker.stop()
    return out


def probe_all(backends: list[registry.Backend], tick=None) -> dict[str, tuple[bool, str]]:
    """{name: (available, reason)} of ``backends`` (in their order), each probed in a worker with its
    time limit; backends that share an environment share a worker, and the environments' workers
    run side by side (as many at once as this machine has cores); ``tick(name)`` after each (a
    progress line; never two at once)."""
    groups: dict[tuple, list[registry.Backend]] = {}
    for b in backends:
        groups.setdefault(tuple(sorted(b.env.items())), []).append(b)
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=max(1, min(len(groups), os.cpu_count() or 1))) as pool:
        answers: dict[str, tuple[bool, str]] = {}
        for got in pool.map(lambda g: _probe_group(g[0], g[1], tick, lock), groups.items()):
            answers.update(got)
    return {b.name: answers[b.name] for b in backends}


def probe(backend: registry.Backend) -> tuple[bool, str]:
    """Whether ``backend`` can run here, and why (in a worker, with a time limit; a hang, a crash or an
    exception is 'unavailable' with the reason)."""
    return probe_all([backend])[backend.name]
