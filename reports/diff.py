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
