"""``--filter``: a regular expression searched in cell ids, with a time limit. Python's ``re``
backtracks, so a pattern such as ``(a+)+$`` can take longer than the universe on one id; the
search runs in a forked child that is killed past ``TIME_LIMIT_S``, and the pattern is refused in
one line naming it."""
from __future__ import annotations

import multiprocessing as mp
import re

from conformance.errors import UsageError

TIME_LIMIT_S = 10.0


def _search(conn, pattern: str, texts: list[str]) -> None:
    regex = re.compile(pattern)
    conn.send([i for i, t in enumerate(texts) if regex.search(t)])
    conn.close()


def matching(pattern: str, texts: list[str], limit_s: float | None = None) -> set[int]:
    """Indices of ``texts`` in which ``pattern`` is found; UsageError naming --filter when it is
    not a regular expression or its search runs past ``limit_s`` (default ``TIME_LIMIT_S``)."""
    limit_s = TIME_LIMIT_S if limit_s is None else limit_s
    try:
        re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--filter {pattern!r} is not a valid regular expression: {exc}") from None
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_search, args=(child, pattern, texts), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(limit_s):
            return set(parent.recv())
    except EOFError:
        pass
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    raise UsageError(f"--filter {pattern!r}: searching {len(texts)} cell ids took over {limit_s:g} s "
                     "(catastrophic backtracking, e.g. nested repeats like (a+)+); simplify the pattern")
