"""The one schema of a run folder's files, used by every reader (report, merge, resume).

``RECORD`` is a line of cells.jsonl, ``RUN_INFO`` is run.json. A schema is a tiny type language:
``str``, ``int``, ``number`` (int or float, or the strings ``"nan"``/``"inf"``/``"-inf"`` the writer
makes of non-finite floats), ``seconds`` (a finite int or float, at least 0: a duration), ``bool``,
``None``, a tuple of alternatives, ``List(item)``, ``Map(value)`` (an object with any string keys)
and ``Obj(fields, required, rest)``; ``ANY`` is any JSON up to ``MAX_DEPTH`` levels. Fields an
``Obj`` does not name are allowed (records from newer versions) as ``rest`` (default ``ANY``: depth
limited, as every value is), fields it names must have their type: the schema admits only what the
readers take. ``problem`` says what is wrong, or None.

Versions (run.json's ``schema``; a folder without it is version 1). Every version's folders load,
and resume: records of an older version are kept as they are and the report shows what they lack.

- 1: the first.
- 2: every record has ``path``, the code path that ran (``conformance.paths``), or for a skip the
  one that would have run; records of version 1 have none (the report shows "not recorded").
- 3: a skip because the backend is unavailable on the machine has ``unavailable``, the probe's
  reason; records of versions 1 and 2 say it only in ``reason`` ("backend unavailable: " and the
  probe's reason), which the report reads as the same field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

VERSION = 3
STATUSES = ("pass", "fail", "skip", "xfail", "xpass", "error", "crash")
MAX_DEPTH = 8
NONFINITE = ("nan", "inf", "-inf")


@dataclass(frozen=True)
class List:
    item: Any


@dataclass(frozen=True)
class Map:
    value: Any


class _Any:
    def __repr__(self) -> str:
        return "any JSON"


ANY = _Any()


@dataclass(frozen=True)
class Obj:
    fields: dict
    required: tuple = field(default=())
    rest: Any = ANY


number = "number"
seconds = "seconds"
SCALAR = (str, number, bool, None)
_MEASURES = ("max_abs", "max_rel", "rel_l2", "cosine", "mismatch", "elementwise", "margin")
METRICS = Obj({**{name: (number, None) for name in _MEASURES}, "criterion": (str, None),
               "nonfinite": (int, None), "size": (int, None), "passed": (bool, None)}, rest=SCALAR)

RECORD = Obj({
    "id": str, "family": str, "op": str, "params": Map((SCALAR, List(SCALAR))), "seed": (int, None),
    "backend": str, "rounding_model": (str, None),
    "status": STATUSES,
    "reason": (str, None), "traceback": (str, None), "metrics": (METRICS, None),
    "outputs": (Map((METRICS, None)), None),
    "tolerance": (Obj({"atol": (number, None), "rtol": (number, None), "max_mismatch": (number, None),
                       "rel_l2": (number, None), "source": (str, None), "terms": (List(str), None)}, rest=SCALAR), None),
    "quality": (Map(ANY), None),
    "duration_s": (seconds, None), "device": (str, None), "retried_from": (str, None),
    "warnings": (List(str), None), "output": (str, None),
    "decided_by": (Obj({"output": (str, None), "criterion": (str, None)}), None),
    "wall_s": (seconds, None), "cpu_s": (seconds, None), "first_in_worker": (bool, None), "path": (str, None),
    "setup_s": (seconds, None), "queue_position": (int, None), "slot": (str, None), "chosen_late": (bool, None),
    "unavailable": (str, None)},
    required=("id", "backend", "status"))

_GPU = Obj({"name": (str, None), "compute_capability": (str, None), "arch": (str, None),
            "driver": (str, None), "runtime": (str, None)})
_BACKEND = Obj({"available": bool, "reason": (str, None), "ops": (Map(List(str)), None)})
SELECTION = Obj({"tier": (str, None), "family": (str, None), "op": (str, None),
                 "backends": (List(str), None), "filter": (str, None), "shard": (str, None),
                 "model": (str, None), "config": (str, None), "inputs": (str, None), "inputs_file": (str, None)})

RUN_INFO = Obj({
    "schema": (int, None),
    "cpu": (Obj({"model": (str, None), "flags": List(str), "cores": (int, None)}), None),
    "gpus": (List(_GPU), None), "os": (str, None), "versions": (Map((str, None)), None),
    "git": (Obj({"commit": (str, None), "dirty": (bool, None)}), None),
    "command": (List(str), str, None), "selection": (SELECTION, None), "tier": (str, None),
    "jobs": (int, None), "timeout_s": (seconds, None), "devices": (List(str), None),
    "started": (str, None), "finished": (str, None), "elapsed_s": (seconds, None),
    "backends": (Map(_BACKEND), None), "rounding_models": (Map(Map(str)), None),
    "counts": (Map(Map(int)), None), "retired_devices": (Map(str), None), "stopped": (str, None),
    "merged_from": (List(str), Map(ANY), None),
    "left_out": (Obj({"budget": (str, None), "why": (str, None), "pairs": (int, None),
                      "per_backend": (Map(int), None), "ids": (List(List(str)), None),
                      "chosen_late": (int, None)}), None),
    "stage_starts": (List(int), None),   # a budgeted run: the queue position of each stage's first pair
    "load": (Obj({"load_1m": (number, None), "cores": (int, None), "one_thread": (number, None),
                  "loops_per_cpu_s": (number, None)}), None),
    "previous_runs": (List(Map(ANY)), None),   # the runs a --resume continued, oldest first
    "previous_run": (Map(ANY), None)})         # ... as folders written before that list kept it


def version(info: dict) -> int:
    """The schema version of a run folder from its run.json (``{}`` when it has none: version 1)."""
    found = info.get("schema", 1)
    return found if isinstance(found, int) and not isinstance(found, bool) else 1


def _name(spec) -> str:
    if spec is None:
        return "null"
    if isinstance(spec, type):
        return {str: "a string", int: "an integer", bool: "true/false"}[spec]
    if spec is number:
        return "a number"
    if spec is seconds:
        return "a finite number of seconds"
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, List):
        return "a list"
    if isinstance(spec, (Map, Obj)):
        return "an object"
    return repr(spec)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _depth_problem(value, path: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"{path}: nested deeper than {MAX_DEPTH} levels"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _depth_problem(v, f"{path}.{k}", depth + 1)
        if found:
            return found
    return None


def _matches(value, spec) -> bool:
    if spec is None:
        return value is None
    if spec is bool:
        return isinstance(value, bool)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec is str:
        return isinstance(value, str)
    if spec is number:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in NONFINITE
    if spec is seconds:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
    if isinstance(spec, str):
        return value == spec
    if isinstance(spec, List):
        return isinstance(value, list)
    if isinstance(spec, (Map, Obj)):
        return isinstance(value, dict)
    return spec is ANY


def _alternatives(spec) -> list:
    if isinstance(spec, tuple):
        return [a for s in spec for a in _alternatives(s)]
    return [spec]


def problem(value: Any, spec, path: str = "") -> str | None:
    """What is wrong with ``value`` under ``spec`` (``path``: where it sits), or None."""
    if spec is ANY:
        return _depth_problem(value, path or "value", 0)
    alternatives = _alternatives(spec)
    matching = [s for s in alternatives if _matches(value, s)]
    if not matching:
        return f"{path or 'value'}: expected {' or '.join(map(_name, alternatives))}, found {_shown(value)}"
    chosen = matching[0]
    if isinstance(chosen, List):
        for i, item in enumerate(value):
            found = problem(item, chosen.item, f"{path}[{i}]")
            if found:
                return found
    elif isinstance(chosen, Map):
        for k, v in value.items():
            found = problem(v, chosen.value, f"{path}.{k}" if path else k)
            if found:
                return found
    elif isinstance(chosen, Obj):
        for name in chosen.required:
            if name not in value:
                return f"{path + '.' if path else ''}{name}: missing"
        for name, v in value.items():
            found = problem(v, chosen.fields.get(name, chosen.rest), f"{path}.{name}" if path else name)
            if found:
                return found
    return None
