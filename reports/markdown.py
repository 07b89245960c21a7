"""A Markdown summary of a run folder (cells.jsonl + run.json), read tolerantly by reports.load.

Every text taken from a run folder goes through ``text`` (or ``code`` for ids): it stays one line of
plain text, so a record cannot add markup, HTML, links or table columns to the summary.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from conformance.run import records
from reports import coverage
from reports.load import Run

MAX_LISTED = 50
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_MARKUP = re.compile(r"[\\`*_\[\]<>|~&]")
_ENTITY = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _one_line(value) -> str:
    """``str(value)`` with tabs and line breaks as spaces, other control characters spelled out."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\t\n\r" else ascii(m.group())[1:-1], str(value))


def text(value) -> str:
    """Plain text for Markdown (and the HTML it may carry): markup characters backslash-escaped,
    ``<``, ``>`` and ``&`` as entities, one line."""
    return _MARKUP.sub(lambda m: _ENTITY.get(m.group()) or "\\" + m.group(), _one_line(value))


def code(value) -> str:
    """A code span holding ``value`` literally: fenced by one more backtick than its longest run,
    ``|`` escaped for tables, one line."""
    body = _one_line(value).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


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
    rows = [[text(b), *(f"{ran[b, a]['ran']}/{sum(ran[b, a].values())}" if (b, a) in ran else "" for a in acts)]
            for b in backends]
    never = [f"- **{text(b)}**, {text(a)}: {text(why[b, a])}" for b in backends for a in acts
             if (b, a) in ran and ran[b, a]["ran"] == 0 and (b, a) in why]
    return (["## Per activation dtype and backend (cells run / cells of the ops it implements)", "",
             _table(["backend", *map(text, acts)], rows), ""] + (never + [""] if never else []))


MAX_REASONS = 3


def coverage_section(run: Run, relations: dict | None = None) -> list[str]:
    """The coverage table (``reports.coverage``): per backend and code path, cells ran, passed,
    failed and skipped, the skip reasons grouped, and each backend's relations between runs when a
    ``relations`` study gave them; a path no cell ran says so in bold."""
    table = coverage.rows([run])
    if not table:
        return []

    def why(row: dict) -> str:
        shown = [f"{n}x {text(reason[:200])}" for reason, n in row["reasons"][:MAX_REASONS]]
        more = len(row["reasons"]) - MAX_REASONS
        return "; ".join(shown + ([f"{more} more reasons"] if more > 0 else []))

    none = coverage.unexercised(table)
    return (["## Coverage per backend and code path", ""]
            + ([f"**{coverage.NO_CELL_RAN}** on {len(none)} path(s): {text(', '.join(none))}", ""] if none else [])
            + [_table(["backend", "path", "ran", "passed", "failed", "skipped", "why skipped"]
                      + (["relations between runs"] if relations else []),
                      [[text(r["backend"]), text(r["path"]),
                        f"0 **{coverage.NO_CELL_RAN}**" if r["none_ran"] else str(r["ran"]),
                        str(r["passed"]), str(r["failed"]), str(r["skipped"]), why(r)]
                       + ([text(relations.get(r["backend"], ""))] if relations else []) for r in table]), ""])


def render(run: Run, relations: dict | None = None) -> str:
    recs, info = run.records, run.info
    out = [f"# kernel-lab conformance: {text(run.path)}", ""]
    if run.problems:
        out += ["**Incomplete run:**", ""] + [f"- {text(p)}" for p in run.problems] + [""]
    cpu = info.get("cpu", {})
    if cpu:
        gpus = ", ".join(g.get("name", "?") for g in info.get("gpus", [])) or "none"
        out += [f"- CPU: {text(cpu.get('model'))} ({text(cpu.get('cores'))} cores), "
                f"flags: {text(' '.join(cpu.get('flags', [])))}",
                f"- GPUs: {text(gpus)}",
                f"- commit: {text(info.get('git', {}).get('commit'))}"
                f"{' (dirty)' if info.get('git', {}).get('dirty') else ''}",
                f"- command: {code(' '.join(info.get('command', [])))}",
                f"- elapsed: {text(info.get('elapsed_s', '?'))} s", ""]
    left = info.get("left_out") if isinstance(info.get("left_out"), dict) else None
    if left:
        per = ", ".join(f"{text(b)} {text(n)}" for b, n in (left.get("per_backend") or {}).items())
        out += [f"Time budget {text(left.get('budget'))}: {text(left.get('pairs'))} pairs left out"
                + (f" ({per})" if per else "") + f"; {text(left.get('chosen_late') or 0)} pairs left out at first "
                "ran, chosen late in the time the chosen ones left.", ""]
    out += coverage_section(run, relations)
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
                   [[text(b), *(str(c.get(s, 0)) for s in cols), str(sum(c.values()))]
                    for b, c in sorted(by_backend.items())]), ""]
    out += ["## Per family, op and backend (backends that implement the op)", "",
            _table(["family", "op", "backend", *cols],
                   [[text(f), text(o), text(b), *(str(c.get(s, 0)) for s in cols)]
                    for (f, o, b), c in sorted(by_op.items())]), ""]
    out += _activation_section(recs, implemented)
    unavailable = run.unavailable()
    if unavailable:
        out += ["## Unavailable backends", ""] + [f"- **{text(n)}**: {text(why)}"
                                                  for n, why in sorted(unavailable.items())] + [""]
    bad = [r for r in recs if r["status"] in records.BAD_STATUSES]
    if bad:
        out += [f"## Failures ({len(bad)})", "",
                _table(["status", "backend", "cell", "reason"],
                       [[r["status"], text(r["backend"]), code(r["id"]), text((r.get("reason") or "")[:300])]
                        for r in bad[:MAX_LISTED]]), ""]
        if len(bad) > MAX_LISTED:
            out.append(f"... and {len(bad) - MAX_LISTED} more in cells.jsonl\n")
    ran = [r for r in recs if r.get("metrics")]
    if ran:
        closest = sorted((r for r in ran if r["status"] == "pass"),
                         key=lambda r: -float(r["metrics"].get("margin", 0) or 0))[:10]
        out += ["## Closest to the tolerance (passing cells, largest margin over every criterion)", "",
                _table(["backend", "cell", "margin", "decided by", "max_abs", "rel_l2", "tolerance source"],
                       [[text(r["backend"]), code(r["id"]), text(_fmt(r["metrics"].get("margin"))), text(_decided(r)),
                         text(_fmt(r["metrics"].get("max_abs"))), text(_fmt(r["metrics"].get("rel_l2"))),
                         text((r.get("tolerance") or {}).get("source", "")[:120])] for r in closest]), ""]
    return "\n".join(out)


CHANGE_TITLES = (("new_failures", "New failures"), ("fixed", "Fixed (failed before, pass now)"),
                 ("margin_moved", "Margin moved by more than 2x"), ("status_changed", "Other status changes"),
                 ("new", "New (cell, backend) pairs"), ("vanished", "Vanished (in the baseline only)"))


def changes(diff: dict, baseline: Run) -> str:
    """The records diff against ``baseline`` (``reports.diff.records_diff``): a count per kind,
    and the new failures, fixed cells and moved margins listed."""
    out = [f"# Changes against the baseline {text(baseline.path)}", "",
           _table(["change", "count"], [[title, str(diff[k]["count"])] for k, title in CHANGE_TITLES]), ""]
    for key, title in CHANGE_TITLES[:3]:
        rows = diff[key]["rows"]
        if rows:
            out += [f"## {title} ({diff[key]['count']})", "",
                    _table(["backend", "cell", "status before → now", "margin before → now", "reason"],
                           [[text(x["backend"]), code(x["id"]), text(f"{x.get('old_status', '')} → {x['status']}"),
                             text(f"{_fmt(x.get('old_margin'))} → {_fmt(x.get('margin'))}"),
                             text(x.get("reason", "")[:300])] for x in rows]), ""]
            if diff[key]["count"] > len(rows):
                out.append(f"... and {diff[key]['count'] - len(rows)} more\n")
    return "\n".join(out)


def _shape(shape) -> str:
    return str(shape.get("label") or shape) if isinstance(shape, dict) else _fmt(shape)


def across_cards(cards: dict) -> str:
    """Two cards side by side (``reports.build.across_cards``): per backend the passes on each, the
    (cell, backend) pairs that pass on one card and not the other with status and margin on each,
    margins more than 2x apart, and the bench rows whose fraction of their in-run ceiling moved by
    more than the A/A noise (all rows, largest move first, when the noise is unknown)."""
    a, b, rec = text(cards["card_a"]), text(cards["card_b"]), cards["records"]
    out = [f"# Across cards: {a} (a) and {b} (b)", "",
           f"a: {text(cards['run_a'])}; b: {text(cards['run_b'])}; {rec['unpaired']} (cell, backend) pairs "
           "recorded on one card only are left out.", "",
           _table(["backend", "pairs on both", "pass on a", "pass on b", "pass on a only", "pass on b only"],
                  [[text(n), str(c["both"]), str(c["pass_a"]), str(c["pass_b"]),
                    f"**{c['a_only']}**" if c["a_only"] else "0", f"**{c['b_only']}**" if c["b_only"] else "0"]
                   for n, c in rec["per_backend"].items()]), ""]
    for key, title in (("a_only", f"Pass on {a} and not on {b}"), ("b_only", f"Pass on {b} and not on {a}"),
                       ("margin_apart", "Pass on both, margins more than 2x apart")):
        rows = rec[key]["rows"]
        out += [f"## {title} ({rec[key]['count']})", ""]
        if rows:
            out += [_table(["backend", "cell", "status a → b", "margin a → b", "reason (the card that does not pass)"],
                           [[text(x["backend"]), code(x["id"]), text(f"{x['a']['status']} → {x['b']['status']}"),
                             text(f"{_fmt(x['a']['margin'])} → {_fmt(x['b']['margin'])}"),
                             text((x["b"] if x["a"]["status"] == "pass" else x["a"])["reason"][:300])]
                            for x in rows]), ""]
            if rec[key]["count"] > len(rows):
                out.append(f"... and {rec[key]['count'] - len(rows)} more\n")
    out += ["## Bench rows: fraction of the in-run ceiling on each card", ""]
    moves = cards["perf"]
    if moves is None:
        return "\n".join(out + ["No perf comparison: it needs the perf JSON of each card.", ""])
    unknown = any(m["beyond"] is None for m in moves)
    shown = [m for m in moves if m["beyond"] is not False]
    out += [f"A/A noise: a {text(cards['noise_a'])}; b {text(cards['noise_b'])}. "
            + (f"The noise of {sum(m['beyond'] is None for m in moves)} row(s) is unknown: they are listed "
               "with the largest move first. " if unknown else "")
            + f"{sum(bool(m['beyond']) for m in moves)} of {len(moves)} (row, ceiling) fractions moved beyond "
            "the A/A noise (b/a outside the product of the row's A/A bands on the two cards).", ""]
    if shown:
        out += [_table(["bench", "shape", "impl", "role", "ceiling", "fraction a", "fraction b", "b/a", "A/A band a, b", ""],
                       [[text(m["bench"]), text(_shape(m["shape"])), text(m["impl"]), text(m["role"]),
                         text(m["ceiling"]), _fmt(m["fraction_a"]), _fmt(m["fraction_b"]),
                         f"**{m['move']:.3g}**" if m["beyond"] else f"{m['move']:.3g}",
                         f"{_fmt(m['band_a'])}, {_fmt(m['band_b'])}",
                         "beyond noise" if m["beyond"] else "noise unknown"] for m in shown[:MAX_LISTED]]), ""]
        if len(shown) > MAX_LISTED:
            out.append(f"... and {len(shown) - MAX_LISTED} more\n")
    return "\n".join(out)
