"""What changed against a baseline run: records keyed by (cell id, backend), benchmarks by
(bench, impl, shape).

Margins are compared where both runs pass; a margin below ``MARGIN_FLOOR`` counts as the floor,
so bit-exact cells (margin 0) and round-off-sized margins do not report huge ratios. A benchmark
changed beyond noise when its [min, max] time ranges of the two runs do not overlap.
"""
from __future__ import annotations

import json
import math

from conformance.run.records import BAD_STATUSES

MARGIN_FLOOR = 1e-3
MARGIN_RATIO = 2.0
MAX_LISTED = 50


def _margin(rec: dict) -> float | None:
    v = (rec.get("metrics") or {}).get("margin")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _item(rec: dict, old: dict | None = None) -> dict:
    out = {"id": rec["id"], "backend": rec["backend"], "status": rec["status"], "reason": rec.get("reason", "")}
    if old is not None:
        out.update(old_status=old["status"], old_margin=_margin(old), margin=_margin(rec))
    return out


def records_diff(current: list[dict], baseline: list[dict]) -> dict:
    """New failures (a bad record whose pair was not bad in the baseline, or was not in it at all:
    a backend or cell the baseline did not have), fixed cells, margins moved by more than 2x, other
    status changes, new and vanished (cell, backend) pairs; each list capped at MAX_LISTED with its
    full count."""
    cur = {(r["id"], r["backend"]): r for r in current}
    old = {(r["id"], r["backend"]): r for r in baseline}
    out: dict[str, list] = {k: [] for k in ("new_failures", "fixed", "margin_moved", "status_changed", "new", "vanished")}
    for k, r in cur.items():
        o = old.get(k)
        if o is None:
            out["new"].append(_item(r))
            if r["status"] in BAD_STATUSES:
                out["new_failures"].append(_item(r))
            continue
        bad, was_bad = r["status"] in BAD_STATUSES, o["status"] in BAD_STATUSES
        if bad and not was_bad:
            out["new_failures"].append(_item(r, o))
        elif was_bad and r["status"] == "pass":
            out["fixed"].append(_item(r, o))
        elif r["status"] != o["status"]:
            out["status_changed"].append(_item(r, o))
        elif r["status"] == "pass":
            m, mo = _margin(r), _margin(o)
            if m is not None and mo is not None:
                ratio = max(m, MARGIN_FLOOR) / max(mo, MARGIN_FLOOR)
                if ratio > MARGIN_RATIO or ratio < 1 / MARGIN_RATIO:
                    out["margin_moved"].append({**_item(r, o), "ratio": ratio})
    out["vanished"] = [_item(o) for k, o in old.items() if k not in cur]
    out["margin_moved"].sort(key=lambda x: -abs(math.log(x["ratio"])))
    return {k: {"count": len(v), "rows": v[:MAX_LISTED]} for k, v in out.items()}


def _bench_key(b: dict) -> tuple:
    return b["bench"], b["impl"], json.dumps(b.get("shape") or {}, sort_keys=True)


def perf_diff(current: list[dict], baseline: list[dict]) -> list[dict]:
    """Benchmarks (kernel-lab rows of reports.perf) whose time range moved beyond the other run's."""
    old = {_bench_key(b): b for b in baseline}
    out = []
    for b in current:
        o = old.get(_bench_key(b))
        if o is None or not b.get("time_s") or not o.get("time_s"):
            continue
        t, to = b["time_s"], o["time_s"]
        if t["min"] > to["max"] or t["max"] < to["min"]:
            out.append({"bench": b["bench"], "impl": b["impl"], "shape": b.get("shape"),
                        "old_median": to["median"], "median": t["median"], "ratio": t["median"] / to["median"],
                        "verdict": "slower" if t["min"] > to["max"] else "faster"})
    return out


def hardware(info: dict) -> str:
    """A run's card in words, from run.json's fingerprint: its GPUs' names with compute capability
    (or arch), else its CPU model; "" when run.json says neither."""
    gpus = sorted({f"{g.get('name', '?')} {g.get('compute_capability') or g.get('arch') or ''}".strip()
                   for g in info.get("gpus") or []})
    return ", ".join(gpus) or str((info.get("cpu") or {}).get("model") or "")


def _side(rec: dict) -> dict:
    return {"status": rec["status"], "margin": _margin(rec), "reason": rec.get("reason", "")}


def cross_card(a: list[dict], b: list[dict]) -> dict:
    """The records of two cards side by side, per (cell, backend) recorded on both: ``rows`` (every
    pair that ran on at least one card, each with ``a`` and ``b``: status, margin, reason);
    ``a_only`` / ``b_only``: pairs that pass on that card and not on the other; ``margin_apart``:
    pairs passing on both whose margins are more than MARGIN_RATIO apart (floored as in
    ``records_diff``); ``per_backend``: per backend, pairs on both and passes on each; ``unpaired``:
    pairs recorded on one card only. Lists capped at MAX_LISTED with their full count."""
    ra = {(r["id"], r["backend"]): r for r in a}
    rb = {(r["id"], r["backend"]): r for r in b}
    rows, a_only, b_only, apart = [], [], [], []
    per_backend: dict[str, dict] = {}
    for k in sorted(ra.keys() & rb.keys()):
        x, y = ra[k], rb[k]
        row = {"id": k[0], "backend": k[1], "a": _side(x), "b": _side(y)}
        counts = per_backend.setdefault(k[1], {"both": 0, "pass_a": 0, "pass_b": 0, "a_only": 0, "b_only": 0})
        counts["both"] += 1
        counts["pass_a"] += x["status"] == "pass"
        counts["pass_b"] += y["status"] == "pass"
        if x["status"] == "skip" and y["status"] == "skip":
            continue
        rows.append(row)
        if (x["status"] == "pass") != (y["status"] == "pass"):
            (a_only if x["status"] == "pass" else b_only).append(row)
            counts["a_only" if x["status"] == "pass" else "b_only"] += 1
        elif x["status"] == "pass" and row["a"]["margin"] is not None and row["b"]["margin"] is not None:
            ratio = max(row["b"]["margin"], MARGIN_FLOOR) / max(row["a"]["margin"], MARGIN_FLOOR)
            if ratio > MARGIN_RATIO or ratio < 1 / MARGIN_RATIO:
                apart.append({**row, "ratio": ratio})
    apart.sort(key=lambda x: -abs(math.log(x["ratio"])))
    capped = {k: {"count": len(v), "rows": v[:MAX_LISTED]}
              for k, v in (("a_only", a_only), ("b_only", b_only), ("margin_apart", apart))}
    return {"rows": rows, **capped, "per_backend": dict(sorted(per_backend.items())),
            "unpaired": len(ra.keys() ^ rb.keys())}


def aa_band(noise: dict | None, rid: str) -> float | None:
    """How far one record's time moved between two runs of unchanged code on its card: the largest
    A/A ratio of ``rid`` either way (``noise`` is noise.json's ``records``); None when unknown."""
    ratios = ((noise or {}).get(rid) or {}).get("ratios")
    return max(max(r, 1 / r) for r in ratios) if ratios else None


def fraction_moves(a: list[dict], b: list[dict], noise_a: dict | None, noise_b: dict | None) -> list[dict]:
    """Per bench row (``bench/shape/impl``) measured on both cards and per ceiling both rows name:
    its fraction of that in-run ceiling on each card and ``move`` = fraction on b / fraction on a.
    The move is beyond noise when it exceeds, either way, the product of the row's A/A bands on
    the two cards (``aa_band``; ``beyond`` None when either is unknown). Beyond-noise rows first,
    then the largest moves."""
    old = {_bench_key(r): r for r in a}
    out = []
    for r in b:
        o = old.get(_bench_key(r))
        if o is None:
            continue
        band_a, band_b = aa_band(noise_a, o.get("name", "")), aa_band(noise_b, r.get("name", ""))
        for ceiling in sorted((o.get("fraction_of") or {}).keys() & (r.get("fraction_of") or {}).keys()):
            fa, fb = o["fraction_of"][ceiling], r["fraction_of"][ceiling]
            if not fa or not fb:
                continue
            move = fb / fa
            beyond = None if band_a is None or band_b is None else max(move, 1 / move) > band_a * band_b
            out.append({"bench": r["bench"], "impl": r["impl"], "role": r.get("role", ""), "shape": r.get("shape"),
                        "ceiling": ceiling, "fraction_a": fa, "fraction_b": fb, "move": move,
                        "band_a": band_a, "band_b": band_b, "beyond": beyond})
    out.sort(key=lambda x: (x["beyond"] is not True, -abs(math.log(x["move"]))))
    return out
