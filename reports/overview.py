"""What the page leads with: what each run ran and what a time budget left out, the failures
(backend, cell, reason, margin, repro), the known findings (xfail records: a declared behaviour,
with its reason) and the status counts per backend and per (family, op, backend), each row naming
its machine when the runs come from more than one."""
from __future__ import annotations

import math
from collections import Counter

from conformance.run.records import BAD_STATUSES, STATUSES
from conformance.run import repro
from reports.load import Run

MAX_FAILURES = 200


def machine(info: dict) -> str | None:
    """A run's machine in a few words: the CPU model, and its GPUs (``Intel Xeon, 8x NVIDIA H200``)."""
    cpu = (info.get("cpu") or {}).get("model")
    gpus = Counter(g.get("name", "?") for g in info.get("gpus") or [])
    parts = ([cpu] if cpu else []) + [f"{n}x {name}" for name, n in gpus.items()]
    return ", ".join(parts) or None


def machines(runs: list[Run]) -> list[str | None] | None:
    """Each run's machine, or None when every run comes from one machine (no column is needed)."""
    names = [machine(r.info) or f"unknown machine ({r.name})" for r in runs]
    return names if len(set(names)) > 1 else None


def implemented(run: Run, rec: dict) -> bool:
    """Whether ``rec``'s op is one its backend implements (unknown without run.json: yes)."""
    ops = ((run.info.get("backends") or {}).get(rec["backend"]) or {}).get("ops")
    return ops is None or rec["op"] in ops.get(rec["family"], ())


def overview(runs: list[Run]) -> dict:
    """Failures (worst margin first, at most MAX_FAILURES listed) and counts, for the template."""
    where = machines(runs)
    failures, known, ran, per_backend, per_op = [], [], [], {}, {}
    for i, run in enumerate(runs):
        m = where[i] if where else None
        sel = run.info.get("selection") or {}
        left = run.info.get("left_out") if isinstance(run.info.get("left_out"), dict) else None
        statuses = Counter(r["status"] for r in run.records)
        ran.append({"run": run.name, "ran": sum(n for s, n in statuses.items() if s != "skip"),
                    "skipped": statuses.get("skip", 0), "backends": len({r["backend"] for r in run.records
                                                                        if r["status"] != "skip"}),
                    "chosen_late": (left or {}).get("chosen_late") or 0,
                    "left_out": left and {"pairs": left.get("pairs"), "budget": left.get("budget"),
                                          "per_backend": list((left.get("per_backend") or {}).items()),
                                          "command": f"kernel-lab conform --out {run.path} --resume"}})
        for r in run.records:
            if r["status"] == "xfail":
                known.append({"backend": r["backend"], "id": r["id"], "reason": r.get("reason") or "",
                              "machine": m})
            per_backend.setdefault((r["backend"], m), Counter())[r["status"]] += 1
            if implemented(run, r):
                per_op.setdefault((r["family"], r["op"], r["backend"], m), Counter())[r["status"]] += 1
            if r["status"] in BAD_STATUSES:
                metrics, decided = r.get("metrics") or {}, r.get("decided_by") or {}
                failures.append({
                    "status": r["status"], "backend": r["backend"], "machine": m, "run": run.name, "id": r["id"],
                    "reason": r.get("reason") or "", "margin": metrics.get("margin"),
                    "decided_by": f"{decided.get('output') or '?'}: {decided['criterion']}" if decided.get("criterion") else "",
                    "repro": repro.command(r["id"], r["backend"], run.tier, sel.get("model"), sel.get("config"),
                                            sel.get("inputs_file"))})
    # errors and crashes (no margin) first, then the largest margin
    failures.sort(key=lambda f: (-(f["margin"] if isinstance(f["margin"], (int, float)) else math.inf), f["backend"], f["id"]))
    table = lambda d: [{"key": k, "counts": [c.get(s, 0) for s in STATUSES], "total": sum(c.values()),  # noqa: E731
                        "bad": sum(c.get(s, 0) for s in BAD_STATUSES)} for k, c in sorted(d.items(), key=lambda x: tuple(map(str, x[0])))]
    known.sort(key=lambda k: (k["backend"], k["id"]))
    return {"machines": where is not None, "failures": failures[:MAX_FAILURES], "n_failures": len(failures),
            "known": known[:MAX_FAILURES], "n_known": len(known), "ran": ran,
            "per_backend": table(per_backend), "per_op": table(per_op)}
