"""`kernel-lab` run in the test's own process, and its one-line errors."""
from __future__ import annotations

from kernel_lab import cli


def main(capsys, *args):
    """``kernel-lab ARGS`` in this process: (exit status, stdout, stderr)."""
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    """The single ``kernel-lab: error:`` line of ``err`` (no traceback beside it)."""
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("kernel-lab: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
