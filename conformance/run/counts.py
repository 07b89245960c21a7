"""Status counts per backend of a list of records, and the text tables the commands print (rich)."""
from __future__ import annotations

import sys
from collections import Counter

from conformance.run import records


def count(recs) -> dict[str, Counter]:
    """backend -> Counter of statuses."""
    out: dict[str, Counter] = {}
    for r in recs:
        out.setdefault(r["backend"], Counter())[r["status"]] += 1
    return out


def text_table(header: list[str], rows: list[list[str]], right: tuple[int, ...] = ()) -> str:
    """Plain text table drawn by rich (columns sized to their contents, long cells wrapped to the
    terminal's width, or 160 columns when the output is not a terminal); the columns numbered in
    ``right`` are right-aligned (numbers). No colour or markup: the text goes to logs as it is."""
    from rich.console import Console
    from rich.table import Table, box

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="right" if i in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 160, no_color=True, markup=False, emoji=False,
                      highlight=False, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return "\n".join(line.rstrip() for line in cap.get().splitlines() if line.strip())


def summary_table(counts: dict[str, Counter]) -> str:
    """Per backend and status, as an aligned text table."""
    cols = list(records.STATUSES)
    return text_table(["backend", *cols, "total"],
                      [[name, *(str(c.get(s, 0)) for s in cols), str(sum(c.values()))]
                       for name, c in sorted(counts.items())], right=tuple(range(1, len(cols) + 2)))


def skip_reasons(counts: dict[str, Counter]) -> str:
    """``backend N skips, ...`` of the backends in ``counts`` (for the line saying nothing ran)."""
    return ", ".join(f"{b} {c.get('skip', 0)} skips" for b, c in sorted(counts.items()))
