"""cells.jsonl: one JSON record per (cell, backend), appended and flushed as each finishes.

Record fields: id, family, op, params, seed, backend, rounding_model, status (pass fail skip xfail
xpass error crash), reason, metrics (of the deciding output: the failing one, else the one with the
largest margin), decided_by (that output's name and the criterion that set its margin:
elementwise, mismatch, rel_l2, nonfinite, shape or refused), outputs (metrics per output),
tolerance (atol, rtol, max_mismatch, rel_l2, source, terms), quality (secondary errors, e.g. against the
float32-state truth or the unquantized attention), duration_s, device (``cpu`` or ``cuda:N`` /
``hip:N``, the visible device the worker was pinned to), retried_from (the device whose worker
died on this pair before it was retried, when it was), warnings (what the worker warned while
running the pair), output (what it printed, kept out of the console), path (the code path that
ran, or for a skip the one that would have: ``conformance.paths``; since schema version 2).
``reason``, ``traceback`` and ``output`` are cut to ``MAX_TEXT`` characters.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Iterable

from conformance.cells import format_value, refuse_control_characters
from conformance.errors import UsageError
from conformance.run import schema
from conformance.run.schema import STATUSES  # noqa: F401 (records.STATUSES, the order of the report tables)

BAD_STATUSES = ("fail", "xpass", "error", "crash")
MAX_TEXT = 2000
_CLIPPED = ("reason", "traceback", "output")
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


def _margin(metrics) -> float | None:
    value = (metrics or {}).get("margin")
    if isinstance(value, str):
        return float(value)   # the writer's "nan" / "inf" (the schema admits no other string)
    return value


def contradiction(record: dict) -> str | None:
    """What in ``record`` disagrees with the rest of it, or None: an id other than the one its family,
    op, params and seed make; a pass (or xpass) with an output that failed or a margin above 1 (a
    comparison passes exactly when its margin is at most 1: ``conformance.compare``); a fail (or
    xfail) whose outputs all passed."""
    parts = [record.get(k) for k in ("family", "op", "params", "seed")]
    if None not in parts and isinstance(parts[2], dict):
        family, op, params, seed = parts
        made = "/".join([family, op, *(f"{k}={format_value(v)}" for k, v in params.items()), f"seed={seed}"])
        if made != record["id"]:
            return f"its family, op, params and seed make the id {made!r}"
    status = record["status"]
    outputs = {name: m for name, m in (record.get("outputs") or {}).items() if m}
    if status in ("pass", "xpass"):
        failed = [name for name, m in outputs.items() if m.get("passed") is False]
        if failed:
            return f"status {status}, but output {failed[0]!r} failed"
        for name, m in [("metrics", record.get("metrics")), *outputs.items()]:
            margin = _margin(m)
            if margin is not None and not margin <= 1:
                return f"status {status}, but {name} has margin {margin:g} (above 1 fails)"
    if status in ("fail", "xfail") and outputs and all(m.get("passed") is True for m in outputs.values()):
        return f"status {status}, but every output passed"
    return None


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; a folder, FIFO, socket or device is refused before it is opened (reading a
    FIFO would wait for a writer forever)."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise RecordsError(f"{path}: is a folder, expected a file")
        if not stat.S_ISREG(mode):
            raise RecordsError(f"{path}: is not a regular file (a FIFO, socket or device), expected a file")
        return path.read_bytes()
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _loads(text: str):
    """json.loads; RecursionError (JSON nested thousands deep) becomes a JSONDecodeError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


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
            rec = _loads(line)
        except json.JSONDecodeError as exc:
            raise RecordsError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise RecordsError(f"{p}:{n}: not a cell record (a JSON object with id, backend, status)")
        wrong = schema.problem(rec, schema.RECORD)
        if wrong:
            raise RecordsError(f"{p}:{n}: not a valid cell record ({wrong})")
        wrong = contradiction(rec)
        if wrong:
            raise RecordsError(f"{p}:{n}: a record that contradicts itself ({wrong}); was it edited?")
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


def read_json(path: str | os.PathLike, shape=schema.RUN_INFO) -> dict:
    """A JSON object file as a dict (a run.json unless told otherwise), checked against ``shape``
    (``schema.RUN_INFO``; None: any object); RecordsError names the file (and the line or field)
    when it is unreadable, not an object or holds a field of the wrong type."""
    p = Path(path)
    if not p.exists():
        raise RecordsError(f"{p}: missing")
    try:
        data = _loads(_read_text(p))
    except json.JSONDecodeError as exc:
        raise RecordsError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise RecordsError(f"{p}: not a JSON object")
    wrong = schema.problem(data, shape) if shape is not None else None
    if wrong:
        raise RecordsError(f"{p}: not a valid run.json ({wrong})")
    return data


class Writer:
    """Appends records to cells.jsonl, each with one unbuffered write, then fsync.

    A failed or short write (disk full, a file-size limit) cuts the file back to its last whole
    record and raises the OSError, so the file never ends in half a line written by this writer
    (nothing is held in a buffer to be written later)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._good = os.lseek(self._fd, 0, os.SEEK_END)

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
            done = os.write(self._fd, line)
            if done != len(line):
                raise OSError(errno.ENOSPC, f"short write ({done} of {len(line)} bytes)")
            os.fsync(self._fd)
        except OSError:
            self._cut_back()
            raise
        self._good += len(line)

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._good)
        except OSError:
            pass  # the resume drops a partial line

    def close(self) -> None:
        os.close(self._fd)


def write_all(path: str | os.PathLike, records: Iterable[dict]) -> None:
    w = Writer(path)
    try:
        for r in records:
            w.write(r)
    finally:
        w.close()


def dump_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, fsynced, renamed over it (a
    full disk leaves the previous file as it was)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(_clean(data), indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
