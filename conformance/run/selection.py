"""What a run covers: the cells of a tier filtered by family, op and id, sharded (or the one cell of a
file of captured tensors, ``--inputs``: ``conformance.inputs.captured``), and the backends named; the
``Selection`` recorded in run.json, which ``--resume`` and ``merge`` check (of a file, its SHA-256).

Shards: ``K/N`` takes cell i when i mod N = K-1 (``shard_by`` None), or, with ``shard_by="cost"``,
the K-th of N parts of about equal estimated time (longest first, each to the part with least so
far). ``shard_from_env`` reads K/N from a batch scheduler's variables.
"""
from __future__ import annotations

import difflib
import heapq
import re
from dataclasses import dataclass
from typing import Mapping

from conformance import families, patterns, registry
from conformance.cells import Cell
from conformance.errors import UsageError
from conformance.inputs import model_cells
from conformance.run import hook_answers
from conformance.run.estimate import first_estimate

SELECTION_KEYS = ("tier", "family", "op", "backends", "filter", "shard", "shard_by", "model", "config", "inputs")
SHARD_BY = ("index", "cost")
MAX_SHARDS = 100_000   # parts of one selection: more than any scheduler runs, far more than a tier's cells
# Scheduler: (index variable, count variable or None, index of the first part); Slurm's first
# index is SLURM_ARRAY_TASK_MIN. Kubernetes gives no count: --shard-count names it.
SCHEDULERS = {
    "Slurm array": ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"),
    "Kubernetes indexed job": ("JOB_COMPLETION_INDEX", None, 0),
    "GitLab parallel": ("CI_NODE_INDEX", "CI_NODE_TOTAL", 1),
    "Buildkite parallelism": ("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT", 0),
}


def _int_var(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise UsageError(f"--shard env: {name}={environ.get(name)!r} is not a whole number") from None


def shard_from_env(environ: Mapping[str, str], count: int | None = None) -> tuple[str, str]:
    """``("K/N", "where it came from")`` from the one scheduler whose index variable is set in
    ``environ`` (``count``: N for Kubernetes, which does not export it); a usage error if none
    or several are set, or the values are not a valid K/N."""
    found = [name for name, (index, _, _) in SCHEDULERS.items() if index in environ]
    if not found:
        raise UsageError("--shard env: no scheduler's index is set (looked for "
                         + ", ".join(v[0] for v in SCHEDULERS.values()) + ")")
    if len(found) > 1:
        raise UsageError(f"--shard env: the indices of several schedulers are set ({', '.join(found)}); "
                         "pass --shard K/N")
    (name,) = found
    index_var, count_var, first = SCHEDULERS[name]
    if name == "Slurm array" and environ.get("SLURM_ARRAY_TASK_STEP", "1") != "1":
        raise UsageError(f"--shard env: the Slurm array has step {environ['SLURM_ARRAY_TASK_STEP']}; "
                         "use consecutive indices (--array=1-N)")
    base = _int_var(environ, first) if isinstance(first, str) else first
    k = _int_var(environ, index_var) - base + 1
    if count_var is None:
        if count is None:
            raise UsageError(f"--shard env: {index_var} is set ({name}) but not the number of parts; "
                             "pass --shard-count N (the job's completions)")
        n, source = count, f"{name}: {index_var}={environ[index_var]}, --shard-count {count}"
    else:
        n = _int_var(environ, count_var)
        source = f"{name}: {index_var}={environ[index_var]}, {count_var}={environ[count_var]}"
        if isinstance(first, str):
            source += f", {first}={environ[first]}"
    if not 1 <= k <= n:
        raise UsageError(f"--shard env: {source} gives part {k} of {n}, outside 1..{n}")
    return f"{k}/{n}", source


def cost_shard(cells: list[Cell], backends: list[registry.Backend], k: int, n: int) -> list[Cell]:
    """Part K of N by estimated time: cells longest first (ties in list order), each to the part
    with the least estimated time so far (ties to the lowest part); the part's cells in list order.
    The estimate is each backend's declared cost of the cells it supports (asked in a worker:
    ``hook_answers``), the same on every machine."""
    answers = hook_answers.ask([(c, b, True) for c in cells for b in backends])

    def cost(cell: Cell) -> float:
        return sum(first_estimate(cell, b) for b in backends
                   if answers[(cell.id, b.name)].skip is None and answers[(cell.id, b.name)].status is None)

    # the parts as a heap of (load, part): only parts that hold a cell are ever taken from it
    heap = [(0.0, p) for p in range(min(n, len(cells)))]
    part_of = {}
    for i in sorted(range(len(cells)), key=lambda i: (-cost(cells[i]), i)):
        load, part = heapq.heappop(heap)
        part_of[i] = part
        heapq.heappush(heap, (load + cost(cells[i]), part))
    return [c for i, c in enumerate(cells) if part_of[i] == k - 1]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"K/N"`` as (K, N); None for None; a usage error for anything else."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d{1,20})\s*/\s*(\d{1,20})\s*", text)
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2)) <= MAX_SHARDS):
        raise UsageError(f"--shard {text!r}: expected K/N with 1 <= K <= N <= {MAX_SHARDS:,}, e.g. 1/2")
    return int(m.group(1)), int(m.group(2))


def unknown_name(what: str, name: str, known) -> UsageError:
    """``unknown WHAT 'NAME'; did you mean X?; known: ...`` (the close matches, when there are any)."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UsageError(f"unknown {what} {name!r}{hint}; known: {', '.join(known)}")


def select_cells(tier: str, family: str | None = None, op: str | None = None,
                 pattern: str | None = None, shard: tuple[int, int] | None = None) -> list[Cell]:
    """The tier's cells, filtered by family, op and a regular expression on the id, then sharded
    (cell i of the filtered list goes to shard i mod N)."""
    check_names(tier, family, op)
    fams = families.families()
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


def check_names(tier: str, family: str | None = None, op: str | None = None) -> None:
    """A usage error, with close matches, for an unknown tier, family or op."""
    if tier not in families.TIERS:
        raise unknown_name("tier", tier, families.TIERS)
    fams = families.families()
    if family is not None and family not in fams:
        raise unknown_name("family", family, fams)
    if op is not None:
        known = {o for name, m in fams.items() if family in (None, name) for o in m.OPS}
        if op not in known:
            raise unknown_name("op", op, sorted(known))


def select_backends(names: list[str] | None) -> list[registry.Backend]:
    """The named backends (all of them for None); an empty list is a usage error."""
    all_ = registry.backends()
    if names is None:
        return list(all_.values())
    if not names:
        raise UsageError("--backend: the list of backends is empty")
    unknown = [n for n in names if n not in all_]
    if unknown:
        raise unknown_name("backend", unknown[0], all_)
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
    model: str | None = None                   # also a model's cells (conformance.inputs.model_cells)
    config: str | None = None                  # ... or those of a config.json
    shard_by: str | None = None                # None: cell i mod N; "cost": balanced estimated time
    shard_from: str | None = None              # the scheduler variables --shard env read (not compared)
    inputs: str | None = None                  # a file of captured tensors: its one cell (conformance.inputs.captured)
    inputs_sha256: str | None = None           # ... its digest (read when not given), compared (the path is not)

    def __post_init__(self):
        if self.shard_by not in (None, *SHARD_BY):
            raise UsageError(f"--shard-by {self.shard_by!r}: expected one of {', '.join(SHARD_BY)}")
        if self.shard_by is not None and self.shard is None:
            raise UsageError("--shard-by: only with --shard K/N or --shard env")
        if self.inputs is not None:
            if self.family is None or self.op is None:
                raise UsageError("--inputs: name the op the file's tensors are the arguments of with --family F "
                                 "--op OP")
            beside = [flag for flag, value in (("--filter", self.filter), ("--shard", self.shard),
                                                ("--model", self.model), ("--config", self.config)) if value]
            if beside:
                raise UsageError(f"--inputs runs the file's one cell: leave out {', '.join(beside)}")
            if self.inputs_sha256 is None:
                from conformance.inputs import captured

                object.__setattr__(self, "inputs_sha256", captured.sha256(self.inputs))

    def check_names(self) -> None:
        """Its tier, family, op and backend names, checked (a usage error with close matches) before
        anything heavy is imported."""
        check_names(self.tier, self.family, self.op)
        select_backends(list(self.backends) if self.backends is not None else None)

    def as_dict(self) -> dict:
        out = {"tier": self.tier, "family": self.family, "op": self.op,
               "backends": sorted(self.backends) if self.backends is not None else None,
               "filter": self.filter, "shard": self.shard, "model": self.model, "config": self.config}
        if self.shard_by not in (None, "index"):
            out["shard_by"] = self.shard_by
        if self.shard_from is not None:
            out["shard_from"] = self.shard_from
        if self.inputs is not None:
            out.update(inputs=f"sha256:{self.inputs_sha256}", inputs_file=self.inputs)
        return out

    def resolve(self) -> tuple[list[Cell], list[registry.Backend]]:
        """Its cells and backends; a selection without a cell, or without a backend, is a usage error."""
        backends = select_backends(list(self.backends) if self.backends is not None else None)
        if self.inputs is not None:
            from conformance.inputs import captured

            cells = [captured.file_cell(self.inputs, self.family, self.op, self.inputs_sha256)]
            self._implemented(cells, backends)
            return cells, backends
        by_cost = self.shard_by == "cost"
        shard = None if by_cost else parse_shard(self.shard)
        cells = select_cells(self.tier, self.family, self.op, self.filter, shard)
        try:
            cells = model_cells.extend(cells, self.model, self.config, self.family, self.op, self.filter, shard)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if by_cost:
            cells = cost_shard(cells, backends, *parse_shard(self.shard))
        if not cells:
            asked = ", ".join(f"{k} {v!r}" for k, v in self.as_dict().items() if v is not None and k != "backends")
            raise UsageError(f"the selection matches no cell ({asked}); `kernel-lab list-cells` shows them")
        self._implemented(cells, backends)
        return cells, backends

    @staticmethod
    def _implemented(cells: list[Cell], backends: list[registry.Backend]) -> None:
        if not any(c.op in b.ops.get(c.family, ()) for b in backends for c in cells):
            raise UsageError(f"none of the backends {', '.join(b.name for b in backends)} implements "
                             f"any of the {len(cells)} selected cells")


def selection_differences(recorded: dict, now: dict, keys=SELECTION_KEYS) -> list[str]:
    """``key: was X, now Y`` for each key of the selection that differs."""
    return [f"{k} was {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]
