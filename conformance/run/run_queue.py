"""A finished run folder's pairs as the local pool queued them, and its items.

The pool runs a cell's backends of one worker environment (``registry.worker_env``) in turn on one
worker: an *item*, whose first pair draws the cell's inputs and computes its oracles for the rest
(a record's ``setup_s``). Records that say where they were queued (``queue_position``, ``slot``) give
the run's real order; older ones the order the pool would have queued them in.
"""
from __future__ import annotations

import bisect
import math
from pathlib import Path

from conformance import registry
from conformance.cells import Cell
from conformance.run import budget, records, workers
from conformance.run.estimate import machine_kind
from conformance.run.selection import select_cells

Pair = tuple[Cell, registry.Backend, dict]   # a pair that ran and its record


def items(pairs: list[Pair], gpus: bool) -> list[list[Pair]]:
    """Consecutive pairs of one cell, one worker environment (``registry.worker_env`` on a machine
    with GPUs or not: ``gpus``) and one slot (their records' ``slot``, where recorded), grouped (the
    pool's items)."""
    out: list[list[Pair]] = []
    for c, b, r in pairs:
        last = out[-1][0] if out else None
        if (last and last[0].id == c.id and registry.worker_env(last[1], gpus) == registry.worker_env(b, gpus)
                and last[2].get("slot") == r.get("slot")):
            out[-1].append((c, b, r))
        else:
            out.append([(c, b, r)])
    return out


def folder_pairs(run_dir: Path) -> tuple[list[Pair], dict, list[int]]:
    """The pairs of a run folder that ran (cell, backend, record), in the order they were queued, its
    run.json, and the sizes of its stages (one for a run without a budget). Where every record has
    its ``queue_position``, the run's own order (``dispatched``); else the order the local pool
    queued them in (``workers.items`` of the cells in the tier's order; a budgeted run's stages one
    after the other, each in the order the budget chooses its pairs at the prices: the run chose its
    second stage again at the rates it learned, which such a folder does not hold)."""
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
    if ran and all(r.get("queue_position") is not None for r in ran.values()):
        queued, sizes = dispatched([(cells[i], known[b], r) for (i, b), r in ran.items()], machine == "gpu",
                                   info.get("stage_starts") or [0])
        return queued, info, sizes
    stages = (budget.choose(pairs, math.inf, int(info.get("jobs") or 1), machine)[0]
              if "left_out" in info else [pairs])
    queued = [(item.cell, b, ran[item.cell.id, b.name]) for stage in stages
              for item in workers.items(workers.by_cell(stage), machine == "gpu") for b in item.backends]
    return queued, info, [len(st) for st in stages]


def dispatched(pairs: list[Pair], gpus: bool, stage_starts: list[int]) -> tuple[list[Pair], list[int]]:
    """``pairs`` in the order they were sent to their slots (records' ``queue_position``), each item's
    pairs together (the pairs one slot ran in turn of one cell and worker environment: ``gpus`` as in
    ``items``), the items in the order their first pairs were sent; and the sizes of the stages, each
    begun at its queue position in ``stage_starts`` (run.json's; the pairs of a resumed folder's
    earlier runs count in the first)."""
    out: list[list[Pair]] = []
    open_item: dict = {}   # slot -> the item it runs
    for c, b, r in sorted(pairs, key=lambda p: p[2]["queue_position"]):
        it = open_item.get(r.get("slot"))
        if it and it[0][0].id == c.id and registry.worker_env(it[0][1], gpus) == registry.worker_env(b, gpus):
            it.append((c, b, r))
        else:
            out.append([(c, b, r)])
            open_item[r.get("slot")] = out[-1]
    sizes = [0] * len(stage_starts)
    for it in out:
        sizes[max(0, bisect.bisect_right(stage_starts, it[0][2]["queue_position"]) - 1)] += len(it)
    return [p for it in out for p in it], [n for n in sizes if n]


def item_firsts(pairs: list[Pair], gpus: bool) -> list[dict]:
    """The record of each item's first pair: the one that paid the item's setup (``gpus``: as ``items``)."""
    return [item[0][2] for item in items(pairs, gpus)]
