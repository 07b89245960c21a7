"""The tolerance audit: per tolerance term of a family (``SPECS``), the worst err/tol margin that
the records of one tier reached where that term was part of the deciding tolerance, with its cell
and backend, and the tier, commit and date the records were measured on.

A record's ``tolerance.terms`` names the terms its deciding tolerance adds up (``["gdn.fp32",
"gdn.state-16bit"]``), so each passing or failing record counts for every term named there (a record
written before tolerances named their terms counts for none). ``kernel-lab audit-tolerances
RUN_DIR...`` writes the result beside each family's tolerances (``tolerance_audit.json``); a term no
record used is listed with ``records: 0`` and no margin.
"""
from __future__ import annotations

from pathlib import Path

from conformance import families
from conformance.errors import UsageError
from conformance.run import records

FILE_NAME = "tolerance_audit.json"
JUDGED = ("pass", "fail")


def read_runs(run_dirs: list[str]) -> tuple[list[dict], dict]:
    """The records of ``run_dirs`` and what they were measured on: tier (one for all), commits,
    dates and the backends that were judged. A folder without run.json is a usage error."""
    recs, tiers, commits, dates = [], set(), set(), set()
    for src in run_dirs:
        folder = Path(src)
        if not folder.is_dir():
            raise UsageError(f"audit-tolerances: {src} is not a run folder")
        info = records.read_json(folder / "run.json")
        git = info.get("git") or {}
        tiers.add(str((info.get("selection") or {}).get("tier")))
        commits.add(f"{git.get('commit')}{' (dirty)' if git.get('dirty') else ''}")
        dates.add(str(info.get("finished") or info.get("started") or "?")[:10])
        recs += records.read(folder / "cells.jsonl")
    if len(tiers) != 1:
        raise UsageError(f"audit-tolerances: the runs cover different tiers ({', '.join(sorted(tiers))})")
    judged = sorted({r["backend"] for r in recs if r["status"] in JUDGED})
    return recs, {"tier": tiers.pop(), "commit": ", ".join(sorted(commits)), "date": ", ".join(sorted(dates)),
                  "backends": judged}


def audit(family: str, recs: list[dict], measured_on: dict) -> dict:
    """The audit of ``family``'s terms over ``recs`` (``measured_on`` from ``read_runs``)."""
    mine = [r for r in recs if r.get("family") == family and r["status"] in JUDGED]
    terms = {}
    for spec in families.get(family).SPECS:
        used = [r for r in mine if spec.name in ((r.get("tolerance") or {}).get("terms") or ())]
        worst = max(used, key=lambda r: float(r["metrics"]["margin"]), default=None)
        terms[spec.name] = {"records": len(used), "worst_margin": None, "worst_cell": None, "worst_backend": None}
        if worst is not None:
            terms[spec.name].update(worst_margin=float(worst["metrics"]["margin"]), worst_cell=worst["id"],
                                    worst_backend=worst["backend"])
    backends = sorted({r["backend"] for r in mine})
    return {"family": family, **measured_on, "backends": backends, "terms": terms}


def path_of(family: str) -> Path:
    """Where a family's audit is kept: beside its tolerances."""
    return Path(families.get(family).__file__).parent / FILE_NAME


def load(family: str) -> dict | None:
    """The committed audit of ``family`` (None if it has none)."""
    path = path_of(family)
    return records.read_json(path, shape=None) if path.exists() else None


def table(result: dict) -> str:
    """One line per term: worst margin, records, cell."""
    lines = [f"{result['family']} ({result['tier']} tier, commit {result['commit']}, {result['date']}; "
             f"backends {', '.join(result['backends']) or 'none'})"]
    for name, t in result["terms"].items():
        margin = "-" if t["worst_margin"] is None else f"{t['worst_margin']:.3g}"
        where = f"  {t['worst_cell']} on {t['worst_backend']}" if t["worst_cell"] else ""
        lines.append(f"  {name:32} {margin:>8}  {t['records']:5d} records{where}")
    return "\n".join(lines)
