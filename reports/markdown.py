"""A Markdown summary of a run folder (cells.jsonl + run.json), read tolerantly by reports.load."""
from __future__ import annotations

from collections import Counter, defaultdict

from conformance import records
from reports.load import Run

MAX_LISTED = 50


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "" if x is None else str(x)


def _decided(rec: dict) -> str:
    d = rec.get("decided_by") or {}
    return f"{d.get('output') or '?'}: {d['criterion']}" if d.get("criterion") else ""


def _activation_section(recs: list[dict], implemented: dict) -> list[str]:
    """Per backend and activation dtype (a record without ``act`` means bfloat16): cells run / cells
    of the ops it implements, and why it skipped every cell of a dtype it never ran."""
    ran: dict[tuple, Counter] = defaultdict(Counter)
    why: dict[tuple, str] = {}
    for r in recs:
        ops = implemented.get(r["backend"])
        if ops is not None and r["op"] not in ops.get(r["family"], ()):
            continue
        key = (r["backend"], (r.get("params") or {}).get("act", "bfloat16"))
        ran[key]["ran" if r["status"] != "skip" else "skip"] += 1
        if r["status"] == "skip":
            why.setdefault(key, r.get("reason", ""))
    acts = sorted({a for _, a in ran})
    if len(acts) < 2:
        return []
    backends = sorted({b for b, _ in ran})
    rows = [[b, *(f"{ran[b, a]['ran']}/{sum(ran[b, a].values())}" if (b, a) in ran else "" for a in acts)]
            for b in backends]
    never = [f"- **{b}**, {a}: {why[b, a]}" for b in backends for a in acts
             if (b, a) in ran and ran[b, a]["ran"] == 0 and (b, a) in why]
    return (["## Per activation dtype and backend (cells run / cells of the ops it implements)", "",
             _table(["backend", *acts], rows), ""] + (never + [""] if never else []))


def render(run: Run) -> str:
    recs, info = run.records, run.info
    out = [f"# kernel-lab conformance: {run.path}", ""]
    if run.problems:
        out += ["**Incomplete run:**", ""] + [f"- {p}" for p in run.problems] + [""]
    cpu = info.get("cpu", {})
    if cpu:
        gpus = ", ".join(g.get("name", "?") for g in info.get("gpus", [])) or "none"
        out += [f"- CPU: {cpu.get('model')} ({cpu.get('cores')} cores), flags: {' '.join(cpu.get('flags', []))}",
                f"- GPUs: {gpus}",
                f"- commit: {info.get('git', {}).get('commit')}"
                f"{' (dirty)' if info.get('git', {}).get('dirty') else ''}",
                f"- command: {' '.join(info.get('command', []))}",
                f"- elapsed: {info.get('elapsed_s', '?')} s", ""]
    by_backend: dict[str, Counter] = defaultdict(Counter)
    by_op: dict[tuple, Counter] = defaultdict(Counter)
    implemented = {n: b.get("ops") for n, b in info.get("backends", {}).items()}
    for r in recs:
        by_backend[r["backend"]][r["status"]] += 1
        ops = implemented.get(r["backend"])  # None: a run recorded before run.json listed the ops
        if ops is None or r["op"] in ops.get(r["family"], ()):
            by_op[(r["family"], r["op"], r["backend"])][r["status"]] += 1
    cols = list(records.STATUSES)
    out += ["## Per backend", "",
            _table(["backend", *cols, "total"],
                   [[b, *(str(c.get(s, 0)) for s in cols), str(sum(c.values()))]
                    for b, c in sorted(by_backend.items())]), ""]
    out += ["## Per family, op and backend (backends that implement the op)", "",
            _table(["family", "op", "backend", *cols],
                   [[f, o, b, *(str(c.get(s, 0)) for s in cols)] for (f, o, b), c in sorted(by_op.items())]), ""]
    out += _activation_section(recs, implemented)
    unavailable = run.unavailable()
    if unavailable:
        out += ["## Unavailable backends", ""] + [f"- **{n}**: {why}" for n, why in sorted(unavailable.items())] + [""]
    bad = [r for r in recs if r["status"] in records.BAD_STATUSES]
    if bad:
        out += [f"## Failures ({len(bad)})", "",
                _table(["status", "backend", "cell", "reason"],
                       [[r["status"], r["backend"], f"`{r['id']}`", r.get("reason", "").replace("|", "/")[:300]]
                        for r in bad[:MAX_LISTED]]), ""]
        if len(bad) > MAX_LISTED:
            out.append(f"... and {len(bad) - MAX_LISTED} more in cells.jsonl\n")
    ran = [r for r in recs if r.get("metrics")]
    if ran:
        closest = sorted((r for r in ran if r["status"] == "pass"),
                         key=lambda r: -float(r["metrics"].get("margin", 0) or 0))[:10]
        out += ["## Closest to the tolerance (passing cells, largest margin over every criterion)", "",
                _table(["backend", "cell", "margin", "decided by", "max_abs", "rel_l2", "tolerance source"],
                       [[r["backend"], f"`{r['id']}`", _fmt(r["metrics"].get("margin")), _decided(r),
                         _fmt(r["metrics"].get("max_abs")), _fmt(r["metrics"].get("rel_l2")),
                         (r.get("tolerance") or {}).get("source", "")[:120]] for r in closest]), ""]
    return "\n".join(out)


CHANGE_TITLES = (("new_failures", "New failures"), ("fixed", "Fixed (failed before, pass now)"),
                 ("margin_moved", "Margin moved by more than 2x"), ("status_changed", "Other status changes"),
                 ("new", "New (cell, backend) pairs"), ("vanished", "Vanished (in the baseline only)"))


def changes(diff: dict, baseline: Run) -> str:
    """The records diff against ``baseline`` (``reports.diff.records_diff``): a count per kind,
    and the new failures, fixed cells and moved margins listed."""
    out = [f"# Changes against the baseline {baseline.path}", "",
           _table(["change", "count"], [[title, str(diff[k]["count"])] for k, title in CHANGE_TITLES]), ""]
    for key, title in CHANGE_TITLES[:3]:
        rows = diff[key]["rows"]
        if rows:
            out += [f"## {title} ({diff[key]['count']})", "",
                    _table(["backend", "cell", "status before → now", "margin before → now", "reason"],
                           [[x["backend"], f"`{x['id']}`", f"{x.get('old_status', '')} → {x['status']}",
                             f"{_fmt(x.get('old_margin'))} → {_fmt(x.get('margin'))}",
                             x.get("reason", "").replace("|", "/")[:300]] for x in rows]), ""]
            if diff[key]["count"] > len(rows):
                out.append(f"... and {diff[key]['count'] - len(rows)} more\n")
    return "\n".join(out)
