"""The command that reproduces one record: ``kernel-lab conform`` selecting exactly its cell (the id,
regex characters escaped, anchored, as ``--filter``; a cell of captured tensors by its file,
``--inputs``) and its backend, each argument quoted for a POSIX shell (``shlex.quote``). ``conform``
writes into a fresh folder unless ``--out`` is given, so the command runs any number of times. The
page's script builds the same string (report.js)."""
from __future__ import annotations

import re
import shlex

_REGEX_CHARS = re.compile(r"[.*+?^${}()|\[\]\\]")


def cell_pattern(cell_id: str) -> str:
    """``--filter`` selecting exactly ``cell_id``."""
    return "^" + _REGEX_CHARS.sub(lambda m: "\\" + m.group(0), cell_id) + "$"


def command(cell_id: str, backend: str, tier: str | None = None, model: str | None = None,
            config: str | None = None, inputs: str | None = None) -> str:
    """The command of one record; ``inputs``: the file of captured tensors its run read (``--inputs``),
    which names the run's one cell by itself."""
    if inputs:
        family, op = cell_id.split("/")[:2]
        return shlex.join(["kernel-lab", "conform", "--inputs", inputs, "--family", family, "--op", op,
                           "--backend", backend])
    args = ["kernel-lab", "conform"]
    for flag, value in (("--tier", tier), ("--model", model), ("--config", config)):
        if value:
            args += [flag, value]
    return shlex.join(args + ["--filter", cell_pattern(cell_id), "--backend", backend])


def verdict(record: dict, tier: str | None = None, inputs: str | None = None) -> str:
    """A record in one paragraph: its status, pair and reason (for a check: the margin and the
    criterion that decided it), the tolerance and its source, and the command that reproduces it
    (``tier``, ``inputs``: as ``command``)."""
    tol = record.get("tolerance") or {}
    bounds = ", ".join(f"{k} {v:g}" for k, v in tol.items() if k != "source" and isinstance(v, int | float))
    source = tol.get("source")
    metrics = record.get("metrics") or {}
    margin = metrics.get("margin")
    why = record.get("reason") or (f"margin {margin:.3g} by {metrics.get('criterion') or '?'}"
                                   if isinstance(margin, int | float) else "no reason given")
    parts = [f"{record['status']}: {record['id']} on {record['backend']}: {why}"]
    if source or bounds:
        parts.append(f"tolerance {bounds or '(none)'}" + (f" from {source}" if source else ""))
    parts.append("repro: " + command(record["id"], record["backend"], tier, inputs=inputs))
    return ". ".join(parts)
