"""The heatmap's data: every record of the runs packed into compact arrays for the page's script.

Strings that repeat (reasons, tolerance sources, rounding models, quality notes) are stored once in
``strings`` and referred to by index; numbers keep 4 significant digits (display only). A record
becomes
``[cell, row, status, margin, duration_s, seed, reason, model, tolerance, extra, outputs, quality, decided_by]``
(``decided_by``: "output: criterion", what set the margin)
(``extra``: the fields this module does not know, e.g. device, warnings, traceback, as one JSON
string; ``outputs``: ``[[name, v0, v1, ...], ...]`` in the order of ``metric_keys``). Records of
backends unavailable on their run's machine are not packed: the page lists those backends once.
"""
from __future__ import annotations

import json
import math

from conformance.run.records import STATUSES
from reports import overview
from reports.load import Run

KNOWN = {"id", "family", "op", "params", "seed", "backend", "status", "reason", "metrics", "outputs",
         "tolerance", "rounding_model", "duration_s", "quality", "decided_by"}


def num(x):
    """4 significant digits; non-numbers (None, 'inf' strings) pass through."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x if isinstance(x, int) else float(f"{x:.4g}")


class _Strings:
    def __init__(self):
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def __call__(self, value) -> int | None:
        if value is None or value == "" or value == {}:
            return None
        s = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        if s not in self.index:
            self.index[s] = len(self.items)
            self.items.append(s)
        return self.index[s]


def row_labels(runs: list[Run]) -> dict[tuple[int, str], str]:
    """(run index, backend) -> heatmap row label: the backend name, plus the run's machine (or its
    folder name, when the runs come from one machine) when two runs hold the same (cell, backend)
    pair (e.g. one CPU and one GPU run); shards share a row."""
    machine = overview.machines(runs)
    seen: dict[str, dict] = {}
    split: set[str] = set()
    for i, run in enumerate(runs):
        for r in run.records:
            where = seen.setdefault(r["backend"], {})
            if where.setdefault(r["id"], i) != i:
                split.add(r["backend"])
    return {(i, r["backend"]): f"{r['backend']} [{machine[i] if machine else run.name}]" if r["backend"] in split else r["backend"]
            for i, run in enumerate(runs) for r in run.records}


def _decided_by(rec: dict) -> str | None:
    d = rec.get("decided_by")
    if not isinstance(d, dict) or not d.get("criterion"):
        return None
    return f"{d.get('output') or '?'}: {d['criterion']}"


def pack(runs: list[Run]) -> dict:
    """JSON-able heatmap data of ``runs`` (see the module docstring)."""
    strings = _Strings()
    labels = row_labels(runs)
    rows: dict[str, int] = {}
    row_info: list[dict] = []
    cells: dict[str, int] = {}
    cell_list: list[list] = []
    metric_keys: list[str] = []
    metric_pos: dict[str, int] = {}
    recs: list[list] = []
    hidden = 0
    for i, run in enumerate(runs):
        unavailable = run.unavailable()
        implemented = {n: b.get("ops") for n, b in run.info.get("backends", {}).items()}
        for r in run.records:
            if r["backend"] in unavailable:
                hidden += 1
                continue
            label = labels[(i, r["backend"])]
            if label not in rows:
                rows[label] = len(row_info)
                row_info.append({"label": label, "backend": r["backend"], "run": i})
            if r["id"] not in cells:
                cells[r["id"]] = len(cell_list)
                cell_list.append([r["id"], r["family"], r["op"], r.get("params") or {}, run.tier])
            outputs = []
            for name, m in (r.get("outputs") or {}).items():
                vals = {}
                for k, v in (m or {}).items():
                    if k not in metric_pos:
                        metric_pos[k] = len(metric_keys)
                        metric_keys.append(k)
                    vals[metric_pos[k]] = num(v)
                outputs.append([strings(name)] + [vals.get(j) for j in range(max(vals, default=-1) + 1)])
            ops = implemented.get(r["backend"])
            not_implemented = ops is not None and r["op"] not in ops.get(r["family"], ())
            extra = {k: v for k, v in r.items() if k not in KNOWN}
            if not_implemented:
                extra["not_implemented"] = True
            metrics = r.get("metrics") or {}
            recs.append([cells[r["id"]], rows[label], STATUSES.index(r["status"]),
                         num(metrics.get("margin")), num(r.get("duration_s")), r.get("seed"),
                         strings(r.get("reason")), strings(r.get("rounding_model")),
                         strings(r.get("tolerance")), strings(extra), outputs,
                         strings(r.get("quality")), strings(_decided_by(r))])
    return {"statuses": list(STATUSES), "strings": strings.items, "metric_keys": metric_keys,
            "rows": row_info, "cells": cell_list, "recs": recs, "hidden_unavailable": hidden,
            "runs": [{"name": r.name, "tier": r.tier, "model": (r.info.get("selection") or {}).get("model"),
                      "config": (r.info.get("selection") or {}).get("config"),
                      "inputs": (r.info.get("selection") or {}).get("inputs_file")} for r in runs]}
