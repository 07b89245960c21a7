"""Coverage per backend and code path: how many cells each (backend, path) ran, passed and failed,
and how many it skipped and why (reasons grouped, most frequent first), so a path no cell ran (an
ISA this CPU lacks, a GPU that is absent, a check that gates the wrong kernel) shows at once.

The path is the record's ``path`` (``conformance.paths``: what ran, or for a skip what would have);
records of schema version 1 have none and count under ``NOT_RECORDED``. Records of ops a backend does
not implement are left out, as in the per-op counts. ``ran`` counts every record but skips;
``failed`` the bad statuses (fail, xpass, error, crash); ``ran - passed - failed`` are xfails.
"""
from __future__ import annotations

from collections import Counter

from conformance.run.records import BAD_STATUSES
from reports import overview
from reports.load import Run

NOT_RECORDED = "not recorded"
NO_CELL_RAN = "no cell ran"


def rows(runs: list[Run]) -> list[dict]:
    """One row per (backend, path[, machine when the runs come from several]), sorted: ``backend``,
    ``path``, ``machine``, ``ran``, ``passed``, ``failed``, ``xfail``, ``skipped``, ``reasons``
    ([(reason, count)], most frequent first) and ``none_ran`` (True when it skipped every cell)."""
    where = overview.machines(runs)
    tally: dict[tuple, Counter] = {}
    reasons: dict[tuple, Counter] = {}
    for i, run in enumerate(runs):
        for r in run.records:
            if not overview.implemented(run, r):
                continue
            key = (r["backend"], r.get("path") or NOT_RECORDED, where[i] if where else None)
            tally.setdefault(key, Counter())[r["status"]] += 1
            if r["status"] == "skip":
                reasons.setdefault(key, Counter())[r.get("reason") or "(no reason recorded)"] += 1
    out = []
    for key in sorted(tally, key=lambda k: tuple(map(str, k))):
        c = tally[key]
        ran = sum(n for s, n in c.items() if s != "skip")
        out.append({"backend": key[0], "path": key[1], "machine": key[2], "ran": ran, "passed": c["pass"],
                    "failed": sum(c[s] for s in BAD_STATUSES), "xfail": c["xfail"], "skipped": c["skip"],
                    "reasons": reasons.get(key, Counter()).most_common(), "none_ran": ran == 0})
    return out


def unexercised(table: list[dict]) -> list[str]:
    """``backend / path`` of the rows no cell ran (the line above the table)."""
    return [f"{r['backend']} / {r['path']}" + (f" [{r['machine']}]" if r["machine"] else "")
            for r in table if r["none_ran"]]
