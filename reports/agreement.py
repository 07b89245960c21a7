"""Cross-backend agreement, bounded from the error metrics the records hold.

Records hold each backend's error against the oracle, not its outputs. For one output, the
elementwise err/tol ratio ``m = max_i |a_i - e_i| / (atol + rtol |e_i|)`` (``elementwise``; the
``margin`` of records written before margins covered every criterion) is a weighted max-norm of ``a - e``; two
backends held to the same oracle ``e`` under the same tolerance (same cell, same rounding model)
therefore differ, in that norm, by ``d(A, B)`` with ``|mA - mB| <= d(A, B) <= mA + mB``.
``d(A, B) > 1`` means some element of A and B differ by more than the tolerance. So for a cell both
pass: ``mA + mB <= 1`` rules disagreement out; ``|mA - mB| > 1`` proves it (possible only where a
tolerance allows some mismatching elements); anything between is undecided, because deciding it
needs both backends' outputs, which the records do not keep. Backends held to different rounding
models are checked against different oracles, and nothing bounds their distance from the records.
"""
from __future__ import annotations

import math
from collections import defaultdict
from itertools import combinations

MAX_LISTED = 30


def _margins(rec: dict) -> dict[str, float]:
    out = {}
    for name, m in (rec.get("outputs") or {}).items():
        m = m or {}
        v = m.get("elementwise", m.get("margin") if "criterion" not in m else None)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[name] = float(v)
    return out


def agreement(records: list[dict]) -> dict:
    """Per pair of backends: cells both pass, split into ruled out / undecided / proven / not
    comparable, and the undecided and proven cells with the largest upper bounds."""
    by_cell: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["status"] == "pass":
            by_cell[r["id"]].append(r)
    pairs: dict[tuple, dict] = {}
    listed: list[dict] = []
    for cell_id, recs in by_cell.items():
        for a, b in combinations(sorted(recs, key=lambda r: r["backend"]), 2):
            p = pairs.setdefault((a["backend"], b["backend"]), {"a": a["backend"], "b": b["backend"], "both_pass": 0,
                                                                "ruled_out": 0, "undecided": 0, "proven": 0,
                                                                "other_oracle": 0, "no_metrics": 0})
            p["both_pass"] += 1
            if a.get("rounding_model") != b.get("rounding_model"):
                p["other_oracle"] += 1
                continue
            ma, mb = _margins(a), _margins(b)
            common = sorted(set(ma) & set(mb))
            if not common:
                p["no_metrics"] += 1
                continue
            upper = max(ma[o] + mb[o] for o in common)
            lower = max(abs(ma[o] - mb[o]) for o in common)
            worst = max(common, key=lambda o: ma[o] + mb[o])
            if lower > 1:
                verdict = "proven"
            elif upper <= 1:
                verdict = "ruled_out"
            else:
                verdict = "undecided"
            p[verdict] += 1
            if verdict != "ruled_out":
                listed.append({"id": cell_id, "a": a["backend"], "b": b["backend"], "output": worst,
                               "margin_a": ma[worst], "margin_b": mb[worst], "lower": lower, "upper": upper,
                               "verdict": verdict, "rounding_model": a.get("rounding_model")})
    for p in pairs.values():
        p["comparable"] = p["both_pass"] - p["other_oracle"]
    listed.sort(key=lambda x: (x["verdict"] != "proven", -x["upper"]))
    return {"pairs": sorted(pairs.values(), key=lambda p: (-p["undecided"] - p["proven"], p["a"], p["b"])),
            "listed": listed[:MAX_LISTED], "n_listed": len(listed)}
