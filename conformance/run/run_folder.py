"""The run folder: its lock (one run at a time), its creation, the resume check (the records
already there and the selection recorded in run.json) and the writing of run.json.

A folder holds ``cells.jsonl`` (one record per pair), ``run.json`` and, while a run owns it,
``.kernel-lab.lock`` naming the owner's pid and host and ``.kernel-lab.reserve``: space held back
so that a run stopped by a full disk can still write run.json saying so.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from conformance.errors import RunStopped, UsageError
from conformance.run import records, schema
from conformance.run.processes import pid_running
from conformance.run.selection import selection_differences

LOCK_NAME = ".kernel-lab.lock"
RESERVE_NAME = ".kernel-lab.reserve"
RESERVE_BYTES = 64 << 10   # run.json is written whole beside the old one before it replaces it


def acquire_lock(out_dir: Path, warn) -> Path:
    """Take ``out_dir``'s lock file (pid, host, start time); a lock whose pid is dead on this host
    is taken over with a warning, a live one is a usage error naming its owner."""
    path = out_dir / LOCK_NAME
    host = socket.gethostname()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if path.is_dir():
                raise UsageError(f"{path}: is a folder, expected kernel-lab's lock file") from None
            if path.exists() and not path.is_file():   # reading a FIFO would wait forever
                raise UsageError(f"{path}: is not a regular file (a FIFO, socket or device), expected "
                                 "kernel-lab's lock file") from None
            try:
                owner = json.loads(path.read_text())
                pid, owner_host = int(owner["pid"]), str(owner["host"])
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError):
                if path.is_dir():
                    raise UsageError(f"{path}: is a folder, expected kernel-lab's lock file") from None
                if time.time() - path.stat().st_mtime < 10:   # being written by its owner right now
                    time.sleep(1)
                    continue
                warn(f"{path}: unreadable lock file; taking it over")
                path.unlink(missing_ok=True)
                continue
            if owner_host != host:
                raise UsageError(f"--out {out_dir} is in use by pid {pid} on host {owner_host} (lock {path}); "
                                 "choose another --out, or remove the lock if that run is gone")
            if pid_running(pid):
                raise UsageError(f"--out {out_dir} is in use by pid {pid} on this host since "
                                 f"{owner.get('started', '?')} (lock {path}); wait for it or choose another --out")
            warn(f"{path}: stale lock of pid {pid} (no longer running); taking it over")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump({"pid": os.getpid(), "host": host, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, fh)
        return path
    raise UsageError(f"--out {out_dir}: could not take the lock {path}")


def release_lock(path: Path) -> None:
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def check_out(out: str | os.PathLike) -> None:
    """A usage error for an empty ``--out`` (it would mean the current folder)."""
    if not str(out).strip():
        raise UsageError("--out: empty; expected a folder path (use . for the current folder)")


def make_out(out: str | os.PathLike) -> Path:
    """``out`` as a writable folder (created if missing); a usage error otherwise (an empty ``out``
    too: it would mean the current folder)."""
    check_out(out)
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: not writable ({exc.strerror or exc})") from None
    return out_dir


def previous_records(out_dir: Path, selection: dict, resume: bool, warn) -> tuple[list[dict], dict | None]:
    """The records already in ``out_dir`` and its run.json (on resume: same selection, or a usage
    error naming the difference). Without resume, a folder holding records is refused."""
    cells_path, run_path = out_dir / "cells.jsonl", out_dir / "run.json"
    if cells_path.is_dir():
        raise records.RecordsError(f"{cells_path}: is a folder, expected a file")
    if not resume:
        if cells_path.exists() and cells_path.stat().st_size > 0:
            raise UsageError(f"--out {out_dir}: cells.jsonl already holds records; "
                             "pass --resume to continue the same selection, or choose another --out")
        return [], None
    message = records.drop_partial_line(cells_path)
    if message:
        warn(message)
    recs = records.read(cells_path)
    if not recs and not run_path.exists():
        return [], None
    info = records.read_json(run_path)
    if schema.version(info) > schema.VERSION:
        raise UsageError(f"--resume: {run_path} is of schema version {schema.version(info)}, newer than this "
                         f"kernel-lab's {schema.VERSION}; resume it with the kernel-lab that wrote it")
    if "selection" not in info:
        raise UsageError(f"--resume: {run_path} records no selection (written by an older kernel-lab); "
                         "choose another --out")
    diff = selection_differences(info["selection"], selection)
    if diff:
        raise UsageError(f"--resume continues the same selection only: {'; '.join(diff)} ({run_path})")
    return recs, info


def write_stopped(path: Path, info: dict, stopped: Exception) -> None:
    """run.json with ``stopped`` saying why the run stopped, if the disk takes it (else the error's
    own message says what to do)."""
    info["stopped"] = str(stopped)
    try:
        records.dump_json(path, info)
    except OSError:
        pass


def write_run_json(path: Path, info: dict) -> None:
    """run.json, or a usage error if it is a folder, or RunStopped if it cannot be written (disk full)."""
    try:
        records.dump_json(path, info)
    except IsADirectoryError:
        raise records.RecordsError(f"{path}: is a folder, expected a file") from None
    except OSError as exc:
        raise RunStopped(f"{path}: cannot write ({exc.strerror or exc})") from None


def hold_reserve(out_dir: Path) -> None:
    """Hold ``RESERVE_BYTES`` of the folder's disk in a file (written, not sparse); a disk too
    full for it is a RunStopped like any other write."""
    path = out_dir / RESERVE_NAME
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise RunStopped(f"{out_dir}: no room for a run ({exc.strerror or exc}): free space first") from None


def free_reserve(out_dir: Path) -> None:
    (out_dir / RESERVE_NAME).unlink(missing_ok=True)
