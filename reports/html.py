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

from bench import gates
from conformance.run.records import STATUSES
from reports import agreement, coverage, figures, matrix, overview
from reports.load import Run
from reports.perf import Perf

TEMPLATES = Path(__file__).parent / "templates"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["g"] = lambda x, p=3: "" if x is None else (f"{x:.{p}g}" if isinstance(x, (int, float)) else str(x))
    # throughputs: plain digits (1,610 rather than 1.61e+03), 3 significant ones below 100
    env.filters["rate"] = lambda x: "" if not isinstance(x, (int, float)) else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}")
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
            "rounding_models": rounding_models(info), "machine": overview.machine(info)}


def rounding_models(info: dict) -> dict[str, dict[str, str]]:
    """run.json's ``{backend: {family: model}}``; a merged run's, from its shards' run.json."""
    shards = info.get("merged_from")
    if isinstance(shards, dict):
        return {b: fams for shard in shards.values() for b, fams in rounding_models(shard or {}).items()}
    return info.get("rounding_models") or {}


def coverage_table(runs: list[Run], relations: dict | None = None) -> dict:
    """The coverage table's rows (``reports.coverage``), the paths no cell ran, and each backend's
    relations between runs (``kernel-lab study relations``) when a study gave them."""
    rows = coverage.rows(runs)
    for r in rows:
        r["relations"] = (relations or {}).get(r["backend"], "")
    return {"rows": rows, "none": coverage.unexercised(rows), "relations": bool(relations)}


def unavailable_list(runs: list[Run]) -> list[dict]:
    out = []
    for run in runs:
        for backend, reason in sorted(run.unavailable().items()):
            n = sum(r["backend"] == backend for r in run.records)
            out.append({"backend": backend, "run": run.name, "reason": reason, "records": n})
    return out


def _shape_key(b: dict) -> str:
    return json.dumps(b.get("shape") or {}, sort_keys=True)


def bench_tables(benchmarks: list[dict]) -> list[dict]:
    """One table per bench: ``ours`` the bench's implementations of role ``ours``, and each row
    with ``vs``: {our impl: the row's median time over that impl's median at the same shape} (one
    column per kernel of ours, so a ratio always names the kernel it is against; none for
    ceilings or for the impl itself)."""
    out = []
    for bench in sorted({b["bench"] for b in benchmarks}):
        rows = [b for b in benchmarks if b["bench"] == bench]
        ours = sorted({b["impl"] for b in rows if b.get("role") == "ours"})
        median = {(b["impl"], _shape_key(b)): b["time_s"]["median"] for b in rows if b.get("role") == "ours"}
        table = []
        for b in rows:
            vs = {} if b.get("role") == "ceiling" else {
                o: b["time_s"]["median"] / median[o, _shape_key(b)] for o in ours
                if o != b["impl"] and (o, _shape_key(b)) in median}
            table.append({**b, "vs": vs, "shape_label": figures.shape_label(b)})
        out.append({"bench": bench, "ours": ours, "rows": table})
    return out


def gate_reading(gate: dict, machine_keys: set[str]) -> dict:
    """The gate with ``reading`` (``bench.gates.reading``), ``shown_verdict`` (a fail of an unmet
    target reads so) and ``elsewhere``: the machine of its A/A rate when it is not the one of these
    benchmarks."""
    reading = gates.reading(gate.get("false_alarm_rate") or "not measured")
    where = gate.get("measured_on") or ""
    elsewhere = where if where and machine_keys and where not in machine_keys and reading != "not measured" else None
    shown = "unmet target" if reading == "unmet target" and gate.get("verdict") == "fail" else gate.get("verdict")
    return {**gate, "reading": reading, "elsewhere": elsewhere, "shown_verdict": shown}


def perf_section(perfs: list[Perf]) -> list[dict]:
    out = []
    for i, p in enumerate(perfs):
        ceilings, ceiling_notes = p.ceilings()
        keys = {(b.get("fingerprint") or {}).get("key") for b in p.benchmarks} - {None}
        judged = [gate_reading(g, keys) for g in p.gates]
        out.append({"path": str(p.path), "tables": bench_tables(p.benchmarks), "benchmarks": p.benchmarks,
                    "other": p.other, "machines": sorted(keys),
                    "gates": [g for g in judged if g.get("verdict") != "skip"],
                    "skipped_gates": [g for g in judged if g.get("verdict") == "skip"],
                    "ceilings": ceilings, "ceiling_notes": ceiling_notes, "problems": p.problems,
                    "roofline": figures.roofline(p.benchmarks, ceilings, salt=f"roofline{i}")})
    return out


def render(runs: list[Run], perfs: list[Perf], studies: list[dict], study_problems: list[str],
           diff: dict | None, baseline: Run | None, cards: dict | None = None,
           relations: dict | None = None) -> str:
    all_records = [r for run in runs for r in run.records]
    return _env().get_template("report.html.j2").render(
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        runs=[run_header(r) for r in runs], statuses=STATUSES, overview=overview.overview(runs),
        coverage=coverage_table(runs, relations),
        totals=[(s, sum(r["status"] == s for r in all_records)) for s in STATUSES],
        unavailable=unavailable_list(runs), data=matrix.pack(runs),
        agreement=agreement.agreement(all_records), studies=studies, study_problems=study_problems,
        perf=perf_section(perfs), diff=diff, baseline=baseline and run_header(baseline), cards=cards,
        css=(TEMPLATES / "report.css").read_text(), script=(TEMPLATES / "report.js").read_text())
