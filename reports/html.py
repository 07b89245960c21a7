"""The self-contained index.html: Jinja2 template reports/templates/report.html.j2 with the CSS,
the script, the SVG figures and the records (reports.matrix) inline. Nothing is fetched: the page
opens from a file:// URL on a machine with no network.
"""
from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import jinja2
from markupsafe import Markup

from conformance.records import STATUSES
from reports import agreement, figures, matrix
from reports.load import Run
from reports.perf import Perf

TEMPLATES = Path(__file__).parent / "templates"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["g"] = lambda x, p=3: "" if x is None else (f"{x:.{p}g}" if isinstance(x, (int, float)) else str(x))
    env.filters["tojson_script"] = lambda x: Markup(script_json(x))
    return env


# Inside <script> the HTML parser reacts to "<!--", "<script" and "</script" (any case); JSON
# strings may spell "<", ">" and "&" as \u escapes, so none of them reaches the parser.
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def script_json(data) -> str:
    """``data`` as JSON safe to inline in a ``<script type="application/json">`` element: ASCII
    only (json.dumps' default), with ``<``, ``>`` and ``&`` as ``\\uXXXX`` escapes."""
    text = json.dumps(data, separators=(",", ":"))
    return re.sub("[<>&]", lambda m: _SCRIPT_UNSAFE[m.group()], text)


def run_header(run: Run) -> dict:
    """What the header shows of one run; missing fields stay None (the template says 'unknown')."""
    info = run.info
    counts = Counter(r["status"] for r in run.records)
    git = info.get("git") or {}
    return {"name": run.name, "path": str(run.path), "cpu": info.get("cpu"), "gpus": info.get("gpus"),
            "os": info.get("os"), "versions": {k: v for k, v in (info.get("versions") or {}).items() if v},
            "commit": git.get("commit"), "dirty": git.get("dirty"),
            "command": " ".join(info["command"]) if isinstance(info.get("command"), list) else info.get("command"),
            "tier": run.tier, "started": info.get("started"), "finished": info.get("finished"),
            "elapsed_s": info.get("elapsed_s"), "counts": [(s, counts.get(s, 0)) for s in STATUSES],
            "n_records": len(run.records), "problems": run.problems,
            "merged_from": len(info["merged_from"]) if isinstance(info.get("merged_from"), (list, dict)) else None,
            "devices": info.get("devices"), "retired": info.get("retired_devices") or {},
            "rounding_models": rounding_models(info)}


def rounding_models(info: dict) -> dict[str, dict[str, str]]:
    """run.json's ``{backend: {family: model}}``; a merged run's, from its shards' run.json."""
    shards = info.get("merged_from")
    if isinstance(shards, dict):
        return {b: fams for shard in shards.values() for b, fams in rounding_models(shard or {}).items()}
    return info.get("rounding_models") or {}


def unavailable_list(runs: list[Run]) -> list[dict]:
    out = []
    for run in runs:
        for backend, reason in sorted(run.unavailable().items()):
            n = sum(r["backend"] == backend for r in run.records)
            out.append({"backend": backend, "run": run.name, "reason": reason, "records": n})
    return out


def vs_ours(benchmarks: list[dict]) -> list[dict]:
    """Each benchmark with ``vs_ours``: its median time over ours' median for the same bench and
    shape (None for ours and the ceilings, or when ours was not measured there)."""
    key = lambda b: (b["bench"], json.dumps(b.get("shape") or {}, sort_keys=True))  # noqa: E731
    ours = {key(b): b["time_s"]["median"] for b in benchmarks if b.get("role") == "ours"}
    return [{**b, "vs_ours": None if b.get("role") in ("ours", "ceiling") or key(b) not in ours
             else b["time_s"]["median"] / ours[key(b)]} for b in benchmarks]


def perf_section(perfs: list[Perf]) -> list[dict]:
    out = []
    for i, p in enumerate(perfs):
        ceilings, ceiling_notes = p.ceilings()
        out.append({"path": str(p.path), "benchmarks": vs_ours(p.benchmarks), "other": p.other,
                    "gates": [g for g in p.gates if g.get("verdict") != "skip"],
                    "skipped_gates": [g for g in p.gates if g.get("verdict") == "skip"],
                    "ceilings": ceilings, "ceiling_notes": ceiling_notes, "problems": p.problems,
                    "roofline": figures.roofline(p.benchmarks, ceilings, salt=f"roofline{i}")})
    return out


def render(runs: list[Run], perfs: list[Perf], studies: list[dict], study_problems: list[str],
           diff: dict | None, baseline: Run | None) -> str:
    all_records = [r for run in runs for r in run.records]
    return _env().get_template("report.html.j2").render(
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        runs=[run_header(r) for r in runs], statuses=STATUSES,
        totals=[(s, sum(r["status"] == s for r in all_records)) for s in STATUSES],
        unavailable=unavailable_list(runs), data=matrix.pack(runs),
        agreement=agreement.agreement(all_records), studies=studies, study_problems=study_problems,
        perf=perf_section(perfs), diff=diff, baseline=baseline and run_header(baseline),
        css=(TEMPLATES / "report.css").read_text(), script=(TEMPLATES / "report.js").read_text())
