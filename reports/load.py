"""Read run folders for the report, tolerating what a crash or a kill leaves behind.

A run folder holds ``run.json`` (fingerprint, command, backends, counts; written at the start and
again at the end) and ``cells.jsonl`` (one record per line). Unlike ``conformance.records.read``,
which refuses a damaged file, this reader keeps every readable record and lists what is missing or
skipped in ``Run.problems``, so the report of a partial run still renders and says why it is partial.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from conformance.records import STATUSES

UNAVAILABLE_PREFIX = "backend unavailable: "


@dataclass
class Run:
    """One run folder: ``info`` is run.json ({} when absent), ``records`` the readable records."""

    path: Path
    info: dict
    records: list[dict]
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def tier(self) -> str | None:
        return self.info.get("tier")

    def unavailable(self) -> dict[str, str]:
        """Backend -> reason, for backends unavailable on the run's machine.

        From run.json's probe results; without run.json, a backend whose every record is a skip
        saying "backend unavailable: ..." counts as unavailable with that reason."""
        if "backends" in self.info:
            return {n: b.get("reason", "(no reason recorded)")
                    for n, b in self.info["backends"].items() if not b.get("available", True)}
        reasons: dict[str, set] = {}
        for r in self.records:
            reason = r.get("reason") or ""
            ok = r["status"] == "skip" and reason.startswith(UNAVAILABLE_PREFIX)
            reasons.setdefault(r["backend"], set()).add(reason[len(UNAVAILABLE_PREFIX):] if ok else None)
        return {b: next(iter(rs)) for b, rs in reasons.items() if len(rs) == 1 and None not in rs}


def _normalise(rec: dict) -> dict:
    """Family, op and params from the id when a record lacks them (``family/op/k=v/.../seed=s``)."""
    parts = rec["id"].split("/")
    rec.setdefault("family", parts[0])
    rec.setdefault("op", parts[1] if len(parts) > 1 else "?")
    if "params" not in rec:
        rec["params"] = dict(p.split("=", 1) for p in parts[2:] if "=" in p and not p.startswith("seed="))
    return rec


def read_records(path: Path) -> tuple[list[dict], list[str]]:
    """The readable records of a cells.jsonl and a list of what was skipped and why."""
    problems: list[str] = []
    if not path.exists():
        return [], [f"no {path.name}: the run wrote no record"]
    text = path.read_text(errors="replace")
    if text and not text.endswith("\n"):
        problems.append(f"{path.name}: the last line is cut short (the run was killed while writing it)")
    out: dict[tuple, dict] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path.name}:{n}: not valid JSON ({exc.msg}); line skipped")
            continue
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("id", "backend", "status")):
            problems.append(f"{path.name}:{n}: not a cell record (needs id, backend, status); line skipped")
            continue
        if rec["status"] not in STATUSES:
            problems.append(f"{path.name}:{n}: unknown status {rec['status']!r}; line skipped")
            continue
        k = (rec["id"], rec["backend"])
        if k in out:
            problems.append(f"{path.name}:{n}: {rec['id']} on {rec['backend']} recorded twice; the later kept")
        out[k] = _normalise(rec)
    return list(out.values()), problems


def load(run_dir: str | Path) -> Run:
    """A run folder; ValueError when ``run_dir`` is not a folder."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ValueError(f"RUN_DIR {run_dir}: not a folder")
    problems: list[str] = []
    info: dict = {}
    run_json = path / "run.json"
    if not run_json.exists():
        problems.append("no run.json: machine fingerprint, versions, command and backend availability unknown")
    else:
        try:
            info = json.loads(run_json.read_text())
        except (ValueError, OSError) as exc:
            problems.append(f"run.json unreadable ({exc}); fingerprint and command unknown")
        if not isinstance(info, dict):
            info = {}
            problems.append("run.json does not hold an object; ignored")
    recs, rec_problems = read_records(path / "cells.jsonl")
    problems += rec_problems
    if info and "finished" not in info and "merged_from" not in info:
        problems.append(f"run.json has no finish time: the run was killed or is still running "
                        f"({len(recs)} records written)")
    if not recs and (path / "cells.jsonl").exists():
        problems.append("cells.jsonl holds no record")
    elif recs and all(r["status"] == "skip" for r in recs):
        problems.append("every record is a skip: nothing was run")
    return Run(path, info, recs, problems)
