"""cells.jsonl: one JSON record per (cell, backend), appended and flushed as each finishes.

Record fields: id, family, op, params, seed, backend, rounding_model, status (pass fail skip xfail
xpass error crash), reason, metrics (of the deciding output: the failing one, else the one with the
largest margin), decided_by (that output's name and the criterion that set its margin:
elementwise, mismatch, rel_l2, nonfinite, shape or refused), outputs (metrics per output),
tolerance (atol, rtol, max_mismatch, rel_l2, source), quality (secondary errors, e.g. against the
float32-state truth or the unquantized attention), duration_s, device (``cpu`` or ``cuda:N`` /
``hip:N``, the visible device the worker was pinned to), retried_from (the device whose worker
died on this pair before it was retried, when it was), warnings (what the worker warned while
running the pair). ``reason`` and ``traceback`` are cut to ``MAX_TEXT`` characters.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from conformance.cells import refuse_control_characters
from conformance.errors import UsageError

STATUSES = ("pass", "fail", "skip", "xfail", "xpass", "error", "crash")
BAD_STATUSES = ("fail", "xpass", "error", "crash")
MAX_TEXT = 2000
_CLIPPED = ("reason", "traceback")
_MARKER_ROOM = 40  # " [... N more characters cut]"


class RecordsError(UsageError):
    """A run folder's file cannot be read (missing, truncated, corrupt, not UTF-8, not a file)."""


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/Inf floats become strings, tuples lists, NumPy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, with a marker saying how many were dropped; a clipped
    text is left as it is (records merged from shards are written again)."""
    if len(text) <= limit + _MARKER_ROOM:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters cut]"


def key(record: dict) -> tuple[str, str]:
    return record["id"], record["backend"]


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise RecordsError(f"{path}: is a folder, expected a file") from None
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_text(path: Path) -> str:
    try:
        return _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordsError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read(path: str | os.PathLike) -> list[dict]:
    """All records of a cells.jsonl ([] if there is none); RecordsError names the first bad line."""
    p = Path(path)
    out, partial = read_partial(p)
    if partial is not None:
        raise RecordsError(f"{p}: last line is truncated (no newline); "
                           "`kernel-lab conform --resume` drops it, or remove it by hand")
    return out


def read_partial(path: str | os.PathLike) -> tuple[list[dict], str | None]:
    """As ``read``, but a half-written last line (no newline: the run was killed while writing it)
    is left out and described in the second value instead of refused (for the report)."""
    p = Path(path)
    if not p.exists():
        return [], None
    text = _read_text(p)
    partial = None
    if text and not text.endswith("\n"):
        partial = f"{p}: the last line (line {text.count(chr(10)) + 1}) is cut short, left out"
        text = text[:text.rfind("\n") + 1]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordsError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or "id" not in rec or "backend" not in rec or "status" not in rec:
            raise RecordsError(f"{p}:{n}: not a cell record (needs id, backend, status)")
        if rec["status"] not in STATUSES:
            raise RecordsError(f"{p}:{n}: unknown status {rec['status']!r}")
        out.append(rec)
    return out, partial


def drop_partial_line(path: str | os.PathLike) -> str | None:
    """Cut a half-written last line (no newline: disk full, power loss) off ``path``.

    Returns a warning saying what was dropped, or None when the file ends cleanly."""
    p = Path(path)
    if not p.exists():
        return None
    data = _read_bytes(p)
    if not data or data.endswith(b"\n"):
        return None
    keep = data.rfind(b"\n") + 1
    line = data.count(b"\n", 0, keep) + 1
    try:
        with open(p, "r+b") as fh:
            fh.truncate(keep)
    except OSError as exc:
        raise RecordsError(f"{p}: a half-written last line (line {line}) cannot be dropped "
                           f"({exc.strerror or exc})") from None
    return f"{p}: dropped a half-written last line ({len(data) - keep} bytes, line {line}); its pair runs again"


def read_json(path: str | os.PathLike) -> dict:
    """A run.json as a dict; RecordsError names the file when it is unreadable or not an object."""
    p = Path(path)
    if not p.exists():
        raise RecordsError(f"{p}: missing")
    try:
        data = json.loads(_read_text(p))
    except json.JSONDecodeError as exc:
        raise RecordsError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise RecordsError(f"{p}: not a JSON object")
    return data


class Writer:
    """Appends records to cells.jsonl, flushing and fsyncing each one.

    A failed write (disk full) cuts the file back to its last whole record and raises the OSError,
    so the file never ends in half a line written by this writer."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fh = open(self.path, "ab")
        self._good = self._fh.tell()

    def write(self, record: dict) -> None:
        """Append ``record``; RecordsError (nothing written) when its id or backend holds a control
        character (refused when cells and backends are made; checked again here, the last gate)."""
        try:
            for field in ("id", "backend"):
                refuse_control_characters(f"record {field}", str(record[field]))
        except ValueError as exc:
            raise RecordsError(str(exc)) from None
        rec = {**record, **{k: clip(str(record[k])) for k in _CLIPPED if record.get(k) is not None}}
        line = (json.dumps(_clean(rec)) + "\n").encode("utf-8")
        try:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError:
            self._cut_back()
            raise
        self._good += len(line)

    def _cut_back(self) -> None:
        try:
            self._fh.truncate(self._good)
            self._fh.seek(self._good)
        except OSError:
            pass  # the resume drops a partial line

    def close(self) -> None:
        self._fh.close()


def write_all(path: str | os.PathLike, records: Iterable[dict]) -> None:
    w = Writer(path)
    try:
        for r in records:
            w.write(r)
    finally:
        w.close()


def dump_json(path: str | os.PathLike, data: dict) -> None:
    Path(path).write_text(json.dumps(_clean(data), indent=2) + "\n")
