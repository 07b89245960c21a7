"""A finished run folder's pairs as the local pool queued them, and its items.

The pool runs a cell's backends of one worker environment (``registry.worker_env``) in turn on one
worker: an *item*, whose first pair draws the cell's inputs and computes its oracles for the rest
(a record's ``setup_s``).
"""
from __future__ import annotations

import math
from pathlib import Path

from conformance import registry
from conformance.cells import Cell
from conformance.run import budget, records, workers
from conformance.run.estimate import machine_kind
from conformance.run.selection import select_cells

Pair = tuple[Cell, registry.Backend, dict]   # a pair that ran and its record


def items(pairs: list[Pair], gpus: bool) -> list[list[Pair]]:
    """Consecutive pairs of one cell and one worker environment (``registry.worker_env`` on a machine
    with GPUs or not: ``gpus``), grouped (the pool's items)."""
    out: list[list[Pair]] = []
    for c, b, r in pairs:
        last = out[-1][0] if out else None
        if last and last[0].id == c.id and registry.worker_env(last[1], gpus) == registry.worker_env(b, gpus):
            out[-1].append((c, b, r))
        else:
            out.append([(c, b, r)])
    return out


def folder_pairs(run_dir: Path) -> tuple[list[Pair], dict, list[int]]:
    """The pairs of a run folder that ran (cell, backend, record), in the order the local pool queued
    them (``workers.items`` of the cells in the tier's order; a budgeted run's stages one after the
    other, each in the order the budget chooses its pairs at the prices: the run chose its second
    stage again at the rates it learned, which the folder does not hold), its run.json, and the
    sizes of its stages (one for a run without a budget)."""
    info = records.read_json(run_dir / "run.json")
    tier = select_cells(info["selection"]["tier"])
    cells = {c.id: c for c in tier}
    order = {c.id: i for i, c in enumerate(tier)}
    recs = records.read_partial(run_dir / "cells.jsonl")[0]
    known = registry.backends()
    rank = {name: i for i, name in enumerate(info.get("backends") or known)}
    ran = {(r["id"], r["backend"]): r for r in recs
           if r["status"] != "skip" and (r.get("wall_s") is not None or r.get("duration_s") is not None)
           and r["id"] in cells and r["backend"] in known}
    pairs = sorted(((cells[i], known[b]) for i, b in ran), key=lambda p: (order[p[0].id], rank.get(p[1].name, 0)))
    machine = machine_kind(info.get("gpus"))
    stages = (budget.choose(pairs, math.inf, int(info.get("jobs") or 1), machine)[0]
              if "left_out" in info else [pairs])
    queued = [(item.cell, b, ran[item.cell.id, b.name]) for stage in stages
              for item in workers.items(workers.by_cell(stage), machine == "gpu") for b in item.backends]
    return queued, info, [len(st) for st in stages]


def item_firsts(pairs: list[Pair], gpus: bool) -> list[dict]:
    """The record of each item's first pair: the one that paid the item's setup (``gpus``: as ``items``)."""
    return [item[0][2] for item in items(pairs, gpus)]
