"""Read run folders for the report, tolerating what a crash or a kill leaves behind.

A run folder holds ``run.json`` (fingerprint, selection, backends, counts; written at the start and
again at the end) and ``cells.jsonl`` (one record per line). What a killed or unfinished run
leaves (no run.json, no finish time, a half-written last line, no records) is listed in
``Run.problems`` and the report still renders; a corrupt file (not JSON, not UTF-8, a folder)
is refused with ``conformance.run.records.RecordsError`` naming it, as every command does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from conformance.errors import shown
from conformance.run import records

OLD_UNAVAILABLE_PREFIX = "backend unavailable: "   # how records before schema version 3 said it


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
        return (self.info.get("selection") or {}).get("tier") or self.info.get("tier")

    def unavailable(self) -> dict[str, str]:
        """Backend -> reason, for backends unavailable on the run's machine.

        From run.json's probe results; without run.json, a backend whose every record is a skip
        of an unavailable backend (its ``unavailable`` field) counts as unavailable with that reason."""
        if "backends" in self.info:
            return {n: b.get("reason", "(no reason recorded)")
                    for n, b in self.info["backends"].items() if not b.get("available", True)}
        reasons: dict[str, set] = {}
        for r in self.records:
            reasons.setdefault(r["backend"], set()).add(r.get("unavailable") if r["status"] == "skip" else None)
        return {b: next(iter(rs)) for b, rs in reasons.items() if len(rs) == 1 and None not in rs}


def _upgrade_margin(rec: dict) -> None:
    """A record written before margins covered every criterion has the elementwise ratio as its
    ``margin``: recompute the deciding output's margin over the criteria its metrics and tolerance
    show (elementwise, mismatch, rel_l2; see ``conformance.compare``) and name the deciding one."""
    m, tol = rec.get("metrics"), rec.get("tolerance") or {}
    if not isinstance(m, dict) or "criterion" in m or not isinstance(m.get("margin"), (int, float)):
        return
    num = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else None  # noqa: E731
    criteria = {"elementwise": float(m["margin"])}
    if tol.get("max_mismatch") and num("mismatch"):
        criteria = {"mismatch": num("mismatch") / tol["max_mismatch"]}
    if tol.get("rel_l2") and num("rel_l2") is not None:
        criteria["rel_l2"] = num("rel_l2") / tol["rel_l2"]
    if m.get("nonfinite"):
        criteria["nonfinite"] = math.inf
    criterion = max(criteria, key=criteria.get)
    margin = criteria[criterion]
    if rec["status"] in ("fail", "xfail") and not margin >= 1:
        margin, criterion = math.inf, "refused"
    output = next((name for name, o in (rec.get("outputs") or {}).items()
                   if isinstance(o, dict) and o.get("margin") == m["margin"]
                   and o.get("passed", True) == (rec["status"] not in ("fail", "xfail"))), None)
    rec["metrics"] = {**m, "elementwise": m["margin"], "margin": margin, "criterion": criterion}
    rec.setdefault("decided_by", {"output": output, "criterion": criterion})


def _upgrade_unavailable(rec: dict) -> None:
    """A record written before schema version 3 says that its backend was unavailable only in its
    reason: give it the ``unavailable`` field."""
    reason = rec.get("reason") or ""
    if "unavailable" not in rec and rec["status"] == "skip" and reason.startswith(OLD_UNAVAILABLE_PREFIX):
        rec["unavailable"] = reason[len(OLD_UNAVAILABLE_PREFIX):]


def clipped(value):
    """``value`` with every string in it (keys too) cut to ``records.MAX_TEXT`` characters: the writer
    clips what it writes, but a folder may come from elsewhere, and a page is built from what is read."""
    if isinstance(value, str):
        return records.clip(value)
    if isinstance(value, dict):
        return {records.clip(k): clipped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clipped(v) for v in value]
    return value


def _normalise(rec: dict) -> dict:
    """Strings clipped (``clipped``); family, op and params from the id when a record lacks them
    (``family/op/k=v/.../seed=s``); the margin over every criterion (``_upgrade_margin``); ``unavailable``
    (``_upgrade_unavailable``)."""
    rec = clipped(rec)
    _upgrade_margin(rec)
    _upgrade_unavailable(rec)
    parts = rec["id"].split("/")
    rec.setdefault("family", parts[0])
    rec.setdefault("op", parts[1] if len(parts) > 1 else "?")
    if "params" not in rec:
        rec["params"] = dict(p.split("=", 1) for p in parts[2:] if "=" in p and not p.startswith("seed="))
    return rec


def read_records(path: Path) -> tuple[list[dict], list[str]]:
    """The records of a cells.jsonl (the later of two for one pair) and what was left out and why."""
    if not path.exists():
        return [], [f"no {path.name}: the run wrote no record"]
    recs, partial = records.read_partial(path)
    problems = [partial] if partial else []
    out: dict[tuple, dict] = {}
    for rec in recs:
        k = records.key(rec)
        if k in out:
            problems.append(f"{shown(rec['id'])} on {shown(rec['backend'])} recorded twice; the later kept")
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
    if run_json.exists():
        info = clipped(records.read_json(run_json))
    else:
        problems.append("no run.json: machine fingerprint, versions, command and backend availability unknown")
    recs, rec_problems = read_records(path / "cells.jsonl")
    problems += rec_problems
    if "stopped" in info:
        problems.append(f"the run stopped: {info['stopped']}")
    elif info and "finished" not in info and "merged_from" not in info:
        problems.append(f"run.json has no finish time: the run was killed or is still running "
                        f"({len(recs)} records written)")
    if not recs and (path / "cells.jsonl").exists():
        problems.append("cells.jsonl holds no record")
    elif recs and all(r["status"] == "skip" for r in recs):
        problems.append("every record is a skip: nothing was run")
    return Run(path, info, recs, problems)
