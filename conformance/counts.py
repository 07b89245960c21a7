"""Status counts per backend of a list of records, and their aligned text table."""
from __future__ import annotations

from collections import Counter

from conformance import records


def count(recs) -> dict[str, Counter]:
    """backend -> Counter of statuses."""
    out: dict[str, Counter] = {}
    for r in recs:
        out.setdefault(r["backend"], Counter())[r["status"]] += 1
    return out


def summary_table(counts: dict[str, Counter]) -> str:
    """Per backend and status, as an aligned text table."""
    cols = list(records.STATUSES)
    rows = [["backend", *cols, "total"]]
    for name, c in sorted(counts.items()):
        rows.append([name, *(str(c.get(s, 0)) for s in cols), str(sum(c.values()))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
                     for r in rows)


def skip_reasons(counts: dict[str, Counter]) -> str:
    """``backend N skips, ...`` of the backends in ``counts`` (for the line saying nothing ran)."""
    return ", ".join(f"{b} {c.get('skip', 0)} skips" for b, c in sorted(counts.items()))
