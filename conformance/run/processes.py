"""Processes of this host as ``/proc`` shows them: whether one is running, when it started, and
those below one."""
from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the parenthesised command name (which may hold spaces):
    the state first; raises OSError where the process is gone."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2:].split()


def pid_running(pid: int) -> bool:
    """The process ``pid`` of this host is running: it exists and, where ``/proc`` says, is not a zombie
    (a run killed in a container whose first process does not reap its orphans stays one, and its
    lock would hold the folder for good)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return True


def started_at(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None when it is gone."""
    try:
        return _stat_fields(pid)[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every living descendant of ``pid``: pid -> its start time (tells a reused pid apart)."""
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            for child in children:
                started = started_at(child)
                if started is not None and child not in out:
                    out[child] = started
                    todo.append(child)
    return out
