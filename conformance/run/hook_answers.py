"""A backend's ``supports(cell)`` and ``path(cell)`` asked in worker processes with a time limit (the
backend's ``probe_timeout_s``), as ``available()`` is (``conformance.run.probe``): a hook that hangs
becomes that pair's ``error`` record, one that kills or exits its process a ``crash`` record, and the
run goes on with a fresh worker; the runner's own process never runs a backend's hook.

One worker per backend environment (``Backend.env``, as the pair's worker has) answers its pairs in
turn, one message per hook.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

from conformance import paths, registry
from conformance.cells import Cell
from conformance.run import spawn


@dataclass(frozen=True)
class Answer:
    """What the hooks said of one pair. ``skip``: ``Backend.skip_reason`` (None: runs; not asked:
    None); ``path``: ``Backend.code_path``; ``status``/``failure``: ``error`` or ``crash`` and why,
    when a hook raised (``supports``), hung or ended its process."""

    skip: str | None
    path: str
    status: str | None = None
    failure: str | None = None


def _answers_here(backend: registry.Backend, cell: Cell, supports: bool):
    if supports:
        try:
            yield "supports", ("ok", backend.skip_reason(cell))
        except registry.HookError as exc:
            yield "supports", ("error", str(exc))
    yield "path", backend.code_path(cell)


def _worker_main(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the runner's to handle
    for msg in spawn.messages(conn):
        for cell, name, supports in msg:
            backend = registry.backends().get(name)
            if backend is None:
                conn.send(("unregistered", None))
                continue
            for answer in _answers_here(backend, cell, supports):
                conn.send(answer)


def _collect(backend: registry.Backend, cell: Cell, supports: bool, got: dict) -> Answer:
    status, failure, skip = None, None, None
    if supports:
        kind, value = got["supports"]
        if kind == "error":
            status, failure = "error", value
        else:
            skip = value
    return Answer(skip, got["path"], status, failure)


def _ask_group(pairs: list[tuple[Cell, registry.Backend, bool]], env: dict[str, str], out: dict) -> None:
    todo = list(pairs)
    while todo:
        proc, conn = spawn.start(_worker_main, (), env)
        try:
            conn.send([(c, b.name, s) for c, b, s in todo])
        except OSError:
            pass   # died at once: the first pair's answer says how
        while todo:
            cell, backend, supports = todo[0]
            got, failed = {}, None
            for hook in (("supports", "path") if supports else ("path",)):
                if not conn.poll(backend.probe_timeout_s):
                    failed = ("error", f"{backend.name}: {hook}() did not answer within "
                                       f"{backend.probe_timeout_s:g} s; killed")
                    break
                try:
                    name, value = conn.recv()
                except (EOFError, OSError):
                    failed = ("crash", f"{backend.name}: the process asking {hook}() died ({spawn.how_ended(proc)})")
                    break
                if name == "unregistered":   # registered at run time by the caller: asked here
                    got = dict(_answers_here(backend, cell, supports))
                    break
                got[name] = value
            todo.pop(0)
            key = (cell.id, backend.name)
            if failed is None:
                out[key] = _collect(backend, cell, supports, got)
                continue
            out[key] = Answer(None, f"{paths.UNKNOWN}: not asked ({failed[1]})", *failed)
            proc.kill()
            proc.join(timeout=5)
            break
        else:
            spawn.stop(proc, conn)


def ask(pairs: list[tuple[Cell, registry.Backend, bool]]) -> dict[tuple[str, str], Answer]:
    """{(cell id, backend name): Answer} of each ``(cell, backend, ask_supports)``: ``path`` always,
    ``supports`` (through ``skip_reason``) when ``ask_supports``."""
    groups: dict[tuple, list] = {}
    for cell, backend, supports in pairs:
        groups.setdefault(tuple(sorted(backend.env.items())), []).append((cell, backend, supports))
    out: dict[tuple[str, str], Answer] = {}
    for env, group in groups.items():
        _ask_group(group, dict(env), out)
    return out
