"""What a run covers: the cells of a tier filtered by family, op and id, sharded, and the backends
named; the ``Selection`` recorded in run.json, which ``--resume`` and ``merge`` check."""
from __future__ import annotations

import re
from dataclasses import dataclass

from conformance import families, model_cells, patterns, registry
from conformance.cells import Cell
from conformance.errors import UsageError

SELECTION_KEYS = ("tier", "family", "op", "backends", "filter", "shard", "model", "config")


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"K/N"`` as (K, N); None for None; a usage error for anything else."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise UsageError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    return int(m.group(1)), int(m.group(2))


def select_cells(tier: str, family: str | None = None, op: str | None = None,
                 pattern: str | None = None, shard: tuple[int, int] | None = None) -> list[Cell]:
    """The tier's cells, filtered by family, op and a regular expression on the id, then sharded
    (cell i of the filtered list goes to shard i mod N)."""
    if tier not in families.TIERS:
        raise UsageError(f"unknown tier {tier!r}; known: {', '.join(families.TIERS)}")
    fams = families.families()
    if family is not None and family not in fams:
        raise UsageError(f"unknown family {family!r}; known: {', '.join(fams)}")
    if op is not None:
        known = {o for name, m in fams.items() if family in (None, name) for o in m.OPS}
        if op not in known:
            raise UsageError(f"unknown op {op!r}; known: {', '.join(sorted(known))}")
    cells = []
    for name, mod in fams.items():
        if family is not None and name != family:
            continue
        cells += [cell for cell in mod.cells(tier) if op is None or cell.op == op]
    if pattern:
        found = patterns.matching(pattern, [c.id for c in cells])
        cells = [c for i, c in enumerate(cells) if i in found]
    if shard is not None:
        k, n = shard
        cells = [c for i, c in enumerate(cells) if i % n == k - 1]
    return cells


def select_backends(names: list[str] | None) -> list[registry.Backend]:
    """The named backends (all of them for None); an empty list is a usage error."""
    all_ = registry.backends()
    if names is None:
        return list(all_.values())
    if not names:
        raise UsageError("--backend: the list of backends is empty")
    unknown = [n for n in names if n not in all_]
    if unknown:
        raise UsageError(f"unknown backend {', '.join(unknown)}; known: {', '.join(all_)}")
    return [all_[n] for n in names]


@dataclass(frozen=True)
class Selection:
    """What a run covers; recorded in run.json so that --resume and merge can check it."""

    tier: str
    family: str | None = None
    op: str | None = None
    backends: tuple[str, ...] | None = None   # None: every registered backend
    filter: str | None = None
    shard: str | None = None                   # "K/N"
    model: str | None = None                   # also a model's cells (conformance.model_cells)
    config: str | None = None                  # ... or those of a config.json

    def as_dict(self) -> dict:
        return {"tier": self.tier, "family": self.family, "op": self.op,
                "backends": sorted(self.backends) if self.backends is not None else None,
                "filter": self.filter, "shard": self.shard, "model": self.model, "config": self.config}

    def resolve(self) -> tuple[list[Cell], list[registry.Backend]]:
        """Its cells and backends; a selection without a cell, or without a backend, is a usage error."""
        backends = select_backends(list(self.backends) if self.backends is not None else None)
        cells = select_cells(self.tier, self.family, self.op, self.filter, parse_shard(self.shard))
        try:
            cells = model_cells.extend(cells, self.model, self.config, self.family, self.op, self.filter,
                                       parse_shard(self.shard))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not cells:
            asked = ", ".join(f"{k} {v!r}" for k, v in self.as_dict().items() if v is not None and k != "backends")
            raise UsageError(f"the selection matches no cell ({asked}); `kernel-lab list-cells` shows them")
        if not any(c.op in b.ops.get(c.family, ()) for b in backends for c in cells):
            raise UsageError(f"none of the backends {', '.join(b.name for b in backends)} implements "
                             f"any of the {len(cells)} selected cells")
        return cells, backends


def selection_differences(recorded: dict, now: dict, keys=SELECTION_KEYS) -> list[str]:
    """``key: was X, now Y`` for each key of the selection that differs."""
    return [f"{k} was {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]
