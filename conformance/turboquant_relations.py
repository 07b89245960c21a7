"""Relations between runs of one TurboQuant backend, checks that need no oracle of their own: the backend
against itself (``conformance.relations`` runs them beside the GDN ones).

- ``tq-batch``: a sequence's decode output is the same run alone (batch position 0, its cache blocks moved
  to other physical blocks by a permutation, the block table remapped) as in a batch of four sequences of
  unequal lengths;
- ``tq-split``: storing N tokens in one call against the first k then the other N - k in a second call
  (k = ``SPLIT_K``; the store is per token, so the bytes should not depend on the calls);
- ``tq-determinism``: the same store and the same decode twice.

Verdicts as in ``conformance.relations``: ``bitwise``, ``within bound`` (the second run's parts put in
place of the first's pass the family check of the first run's cell), ``not``, ``n/a`` (an op the
relation needs is missing or skips the shape; the reason says which). One preset (4-bit keys and values,
Hadamard rotation), bfloat16 activations, D = 64, Hk = 2 with G = 4 query heads per kv head, 16-token
blocks, in the first cache layout (AoS, else SoA) the backend runs: small enough for the Triton interpreter.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell
from conformance.families.turboquant.matrix import decode_cell, store_cell
from conformance.relation_verdicts import BackendRuns, worst

RELATIONS = ("tq-batch", "tq-split", "tq-determinism")
LENS = (37, 100, 64, 5)
ALONE = 2                        # the sequence run alone (a middle batch position)
STORE_TOKENS, SPLIT_K = 64, 23
LAYOUTS = ("aos", "soa")         # the first one the backend runs on the shape
_SHAPE = dict(preset="turboquant_4bit_nc", bs=16, rotation="hadamard", D=64, act="bfloat16")


def decode_base(layout: str = "aos", lens: tuple[int, ...] = LENS) -> Cell:
    """The batch decode cell: four sequences of ``LENS`` tokens."""
    return decode_cell("decode", hk_g=(2, 4), lens=lens, sinks=False, layout=layout, **_SHAPE)


def store_base(layout: str = "aos", ntok: int = STORE_TOKENS) -> Cell:
    """A store cell of ``ntok`` tokens."""
    return store_cell(Hk=2, ntok=ntok, layout=layout, **_SHAPE)


class TurboQuantRelations(BackendRuns):
    """One backend's TurboQuant runs and checks (in this process)."""

    def __init__(self, backend_name: str):
        super().__init__(backend_name, "turboquant")

    def layout(self, op: str, base) -> tuple[str | None, str | None]:
        """(the first of ``LAYOUTS`` whose ``base(layout)`` cell ``op`` runs on this backend, None) or (None, why
        not)."""
        if op not in self.ops:
            return None, f"no turboquant {op} op"
        reasons = []
        for layout in LAYOUTS:
            why = self.supported(base(layout))
            if why is None:
                return layout, None
            reasons.append(why)
        return None, "; ".join(dict.fromkeys(reasons))

    def tq_batch(self) -> dict:
        layout, why = self.layout("decode", decode_base)
        if why:
            return {"verdict": "n/a", "reason": why}
        cell = decode_base(layout)
        x = self.family.make_inputs(cell)
        first = self.run(cell, x)
        j, blocks = ALONE, x["kv_cache"].shape[0]
        sigma = np.random.default_rng(7).permutation(blocks)          # physical block b -> sigma[b]
        moved = {n: np.empty_like(x[n]) for n in ("kv_cache", "key_cache", "value_cache")}
        for n, a in moved.items():
            a[sigma] = x[n]
        alone_cell = decode_base(layout, (LENS[j],))
        alone = {**x, **moved, "query": x["query"][j:j + 1], "seq_lens": x["seq_lens"][j:j + 1],
                 "block_table": sigma[x["block_table"][j:j + 1]].astype(np.int32)}
        second = self.run(alone_cell, alone)
        spliced = {"out": np.array(first["out"], copy=True)}
        spliced["out"][j] = np.asarray(second["out"])[0]
        return {"verdict": self.verdict(cell, x, first, spliced, [("out", j)])}

    def tq_split(self) -> dict:
        layout, why = self.layout("store", store_base)
        if why:
            return {"verdict": "n/a", "reason": why}
        cell = store_base(layout)
        x = self.family.make_inputs(cell)
        first = self.run(cell, x)
        head, tail = slice(0, SPLIT_K), slice(SPLIT_K, STORE_TOKENS)
        cache = x["kv_cache"]
        for part, n in ((head, SPLIT_K), (tail, STORE_TOKENS - SPLIT_K)):
            piece = {**x, "kv_cache": cache, **{k: x[k][part] for k in ("key", "value", "slot_mapping")}}
            cache = self.run(store_base(layout, n), piece)["kv_cache"]
        spliced = {"kv_cache": np.asarray(cache)}
        return {"verdict": self.verdict(cell, x, first, spliced, [("kv_cache", slice(None))])}

    def tq_determinism(self) -> dict:
        per = {}
        for op, base, name in (("store", store_base, "kv_cache"), ("decode", decode_base, "out")):
            layout, why = self.layout(op, base)
            if why:
                per[op] = "n/a"
                continue
            cell = base(layout)
            x = self.family.make_inputs(cell)
            first, second = self.run(cell, x), self.run(cell, x)
            per[op] = self.verdict(cell, x, first, second, [(name, slice(None))])
        verdict = worst(per.values())
        if verdict == "n/a":
            return {"verdict": "n/a", "reason": "no store or decode op it runs", "ops": per}
        return {"verdict": verdict, "ops": per}

    def all(self) -> dict:
        """Every relation; one that raises is an ``error`` naming the exception."""
        out = {}
        for name in RELATIONS:
            try:
                out[name] = {"ops": {}, **getattr(self, name.replace("-", "_"))()}
            except Exception as exc:
                out[name] = {"verdict": "error", "reason": f"{type(exc).__name__}: {str(exc)[:300]}", "ops": {}}
        return out
