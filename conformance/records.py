"""cells.jsonl: one JSON record per (cell, backend), appended and flushed as each finishes.

Record fields: id, family, op, params, seed, backend, rounding_model, status (pass fail skip xfail
xpass error crash), reason, metrics (of the deciding output), outputs (metrics per output),
tolerance (atol, rtol, max_mismatch, rel_l2, source), quality (secondary errors, e.g. against the
float32-state truth or the unquantized attention), duration_s.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

STATUSES = ("pass", "fail", "skip", "xfail", "xpass", "error", "crash")
BAD_STATUSES = ("fail", "xpass", "error", "crash")


class RecordsError(ValueError):
    """cells.jsonl cannot be read (truncated, corrupt, or not a record file)."""


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


def key(record: dict) -> tuple[str, str]:
    return record["id"], record["backend"]


def read(path: str | os.PathLike) -> list[dict]:
    """All records of a cells.jsonl; RecordsError names the first bad line."""
    p = Path(path)
    if not p.exists():
        return []
    text = p.read_text()
    if text and not text.endswith("\n"):
        raise RecordsError(f"{p}: last line is truncated (no newline); fix or remove it")
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
    return out


class Writer:
    """Appends records to cells.jsonl, flushing and fsyncing each one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps(_clean(record), sort_keys=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

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


def clean(value: Any) -> Any:
    return _clean(value)
