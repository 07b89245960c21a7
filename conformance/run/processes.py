"""Processes of this host as ``/proc`` shows them: whether one is running, and those below one."""
from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/PID/stat`` line after the parenthesised command name (which may hold
    spaces): the state first, then the parent's pid."""
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
        return _stat_fields(Path(f"/proc/{pid}/stat").read_text())[0] != "Z"
    except OSError:
        return True


def descendants(pid: int) -> set[int]:
    """The pids of the processes below ``pid`` now, read from ``/proc`` (none where it is not readable)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(_stat_fields(stat.read_text())[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
