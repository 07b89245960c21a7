"""Child processes started by ``spawn`` with extra environment variables (e.g. ``TRITON_INTERPRET=1``,
``CUDA_VISIBLE_DEVICES``) that the parent's own environment keeps none of."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

_ENVIRON = threading.Lock()   # the child's environment is set in os.environ around its start


def start(target, args: tuple, env: dict[str, str]):
    """A started daemon process running ``target(child_end, *args)`` under ``os.environ`` plus
    ``env``, and the parent's end of its pipe: ``(process, connection)``. Safe to call from several
    threads at once."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    with _ENVIRON:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            proc = ctx.Process(target=target, args=(child, *args), daemon=True)
            proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    child.close()
    return proc, conn


def messages(conn):
    """In a child: what the parent sends, one message at a time, until it sends ``None`` (``stop``) or
    closes its end."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        yield msg


def stop(proc, conn) -> None:
    """Ask the child to end (``None`` on its pipe), wait up to 5 s, then kill it if it is still alive."""
    try:
        conn.send(None)
    except (OSError, BrokenPipeError):
        pass
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)


def how_ended(proc) -> str:
    """How the ended child ``proc`` ended, waiting up to 5 s for it: ``signal SIGSEGV`` (or ``signal N``
    for a number without a name) or ``exit status N``."""
    proc.join(timeout=5)
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
