"""`kernel-lab study relations`: per GDN or TurboQuant backend, which relations between its own runs hold
bitwise, within its rounding model's bound, or not (``conformance.relations``: GDN batch, split, rollback,
determinism; TurboQuant tq-batch, tq-split, tq-determinism; a family the backend lacks is n/a).

Each backend runs in its own process with its environment (``Backend.env``: the Triton interpreter's
``TRITON_INTERPRET=1``) and a time limit; a process that dies or runs out of time is that backend's
``error``, named in the result. The report shows the result as a column beside each backend.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conformance.studies import bounded_int

NAME = "relations"
DESCRIPTION = ("batch, split, rollback and run-to-run relations of each GDN and TurboQuant backend: bitwise, "
               "within bound or not")


def add_arguments(parser) -> None:
    parser.add_argument("--backend", help="comma-separated GDN or TurboQuant backends (default: every one that runs "
                        "on a CPU)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a backend may take (default 900)")


def _backends(args) -> list[str]:
    from conformance import registry

    known = {n: b for n, b in registry.backends().items() if {"gdn", "turboquant"} & set(b.ops)}
    if args.backend is None:
        return [n for n, b in known.items() if not b.uses_gpu]
    names = [n for n in args.backend.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--backend {args.backend!r}: expected GDN or TurboQuant backends from {', '.join(known)}")
    return names


def check(args) -> None:
    """Every argument, before any work: ValueError naming the option."""
    _backends(args)
    bounded_int("--timeout", args.timeout, 1, 24 * 3600)


def _names() -> list[str]:
    from conformance.turboquant_relations import RELATIONS as TQ_RELATIONS
    from conformance.relations import RELATIONS

    return list(RELATIONS + TQ_RELATIONS)


def _one(name: str, timeout: int) -> dict:
    from conformance import registry

    env = {**os.environ, **registry.get(name).env}
    try:
        done = subprocess.run([sys.executable, "-m", "conformance.relations", name], env=env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        why = f"timed out after {timeout} s"
    else:
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])["relations"]
        why = f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"
    return {r: {"verdict": "error", "reason": why, "ops": {}} for r in _names()}


def run(args) -> dict:
    return {"study": NAME, "relations": _names(),
            "backends": {name: _one(name, args.timeout) for name in _backends(args)}}


def summarize(result: dict) -> str:
    names = result["relations"]
    width = {n: max(14, len(n) + 2) for n in names}
    lines = [f"{'backend':<22}" + "".join(f"{n:>{width[n]}}" for n in names)]
    for backend, rel in result["backends"].items():
        lines.append(f"{backend:<22}" + "".join(f"{rel[n]['verdict']:>{width[n]}}" for n in names))
    return "\n".join(lines)
