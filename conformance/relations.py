"""Relations between runs of one GDN backend, checks that need no oracle of their own: the backend
against itself.

- ``batch``: a sequence's o and final state are the same run alone (batch position 0, every slot of
  the pool moved by a permutation) as in a batch of four;
- ``split``: a prefill of T tokens against a prefill of T - k tokens then k decode calls (k = 3; a
  backend without decode: k one-token prefill calls), the pool carried;
- ``rollback``: spec decode of 4 drafts, the state it stores after a accepted tokens (a = 2 and 4)
  against a fresh prefill of those a tokens from the same state (checked as the prefill's cell, whose
  model's bound is the looser of the two);
- ``determinism``: the same call twice.

Each relation compares the parts the two runs share (o rows, state slots) and says ``bitwise`` (every
bit equal), ``within bound`` (not bitwise, but the second run's parts, put in place of the first's,
pass the family check of the first run's cell under the backend's rounding model: both are within the
model's bound of the exact answer), ``not`` (they fail it), ``n/a`` (the backend lacks an op the
relation needs, or skips its shape; the reason says which) or ``error`` (a run raised; the reason names it). A relation over several ops takes the worst. The runs use
float32 pools and bfloat16 activations (small heads: H=2, HV=4, K=V=64), so the only differences
the math allows are the order of float32 operations. The prefill and decode of ``split`` and
``rollback`` get the same gates: g and beta from the backend's own gating op (the reference's where it
has none), beta kept in float32 as the fused decodes keep it, and the raw A_log, a, b, dt_bias for the
fused decodes.

``python -m conformance.relations BACKEND`` prints one backend's result as JSON, the GDN relations and
the TurboQuant ones (``conformance.turboquant_relations``; the study ``relations`` runs it in a
process per backend, with the backend's environment).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from conformance import registry
from conformance.cells import Cell
from conformance.families.gdn import inputs as gdn_inputs
from conformance.families.gdn.matrix import cell_of
from conformance.relation_verdicts import BackendRuns, worst

RELATIONS = ("batch", "split", "rollback", "determinism")
# a relation that raised is "error" (``Relations.all``), outside the order of ``relation_verdicts.VERDICTS``
SPLIT_K = 3
ROLLBACK_ACCEPTED = (2, 4)
BATCH_ALONE = 2                     # the sequence run alone (a middle batch position)
_SHAPE = dict(state="float32", heads=(2, 4), K=64, decay="weak", slots="shuffled", qk="unit")
LENS = (37, 100, 64, 5)


def base_cell(op: str) -> Cell:
    """The batch cell of ``op``: four sequences (prefill: ``LENS`` tokens; spec_decode: 4 drafts each,
    resumed from column 0)."""
    if op == "recurrent":
        return cell_of(op, dict(_SHAPE, lens=LENS, interval=1, act="bfloat16"))
    if op == "chunked":
        return cell_of(op, dict(_SHAPE, lens=LENS, split=None, act="bfloat16"))
    if op == "decode":
        shape = {k: v for k, v in _SHAPE.items() if k != "K"}
        return cell_of(op, dict(shape, KV=(64, 64), N=4, act="bfloat16"))
    if op == "spec_decode":
        return cell_of(op, dict(_SHAPE, drafts=(4, 4, 4, 4), accepted="1", act="bfloat16"))
    raise ValueError(f"op: expected recurrent, chunked, decode or spec_decode, got {op!r}")


class Relations(BackendRuns):
    """One backend's GDN runs and checks (in this process)."""

    def __init__(self, backend_name: str):
        super().__init__(backend_name, "gdn")

    # ---- gates shared by prefill and decode

    def gates(self, gate_args: dict) -> tuple[np.ndarray, np.ndarray]:
        """g, beta float32 from the backend's gating op, else the reference's."""
        args = tuple(gate_args[n] for n in ("A_log", "a", "b", "dt_bias"))
        if "gating" in self.ops:
            cell = self.family_gating_cell(gate_args["a"].shape)
            out = self.run(cell, dict(zip(("A_log", "a", "b", "dt_bias"), args)))
            return out["g"], out["beta"]
        from reference.gdn import numpy_ref
        return numpy_ref.gating(*args)

    @staticmethod
    def family_gating_cell(shape) -> Cell:
        from conformance.cells import make_cell
        return make_cell("gdn", "gating", HV=shape[1], T=shape[0], act="bfloat16")

    def prefill_op(self) -> str | None:
        """The prefill op the split and rollback relations use: chunked, else recurrent, that the backend
        implements and runs on this shape; None when neither."""
        for op in ("chunked", "recurrent"):
            if op in self.ops and self.supported(base_cell(op)) is None:
                return op
        return None

    def prefill(self, op: str, q, k, v, g, beta, lens, pool, slots) -> tuple[Cell, dict, dict]:
        """One prefill call of ``op``: its cell, inputs and outputs (o, the whole pool as float32)."""
        cell = cell_of(op, dict(_SHAPE, lens=tuple(int(n) for n in lens),
                                **({"interval": 1} if op == "recurrent" else {"split": None}), act="bfloat16"))
        inputs = {"q": q, "k": k, "v": v, "g": np.asarray(g, np.float32), "beta": np.asarray(beta, np.float32),
                  "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32), "state": pool,
                  "state_indices": np.asarray(slots, np.int32), "scale": None, "use_qk_l2norm": True,
                  "l2norm_eps": 1e-6, "state_dtype": "float32",
                  **({"state_write_interval": 1, "calls": 1} if op == "recurrent" else {"chunk_size": 64, "split": None})}
        return cell, inputs, self.run(cell, inputs)

    def _pool_ops(self, per_op: dict):
        """(op, its base cell) of each pool op the backend runs; an op it implements but does not support
        on the base cell is ``n/a`` in ``per_op``."""
        for op in ("recurrent", "chunked", "decode", "spec_decode"):
            if op not in self.ops:
                continue
            cell = base_cell(op)
            if self.supported(cell):
                per_op[op] = "n/a"
                continue
            yield op, cell

    # ---- the relations

    def batch(self) -> dict:
        per_op = {}
        for op, cell in self._pool_ops(per_op):
            x = self.family.make_inputs(cell)
            first = self.run(cell, x)
            pool = x["state"]
            sigma = np.random.default_rng(7).permutation(pool.shape[0])     # slot s -> sigma[s]
            moved = np.empty_like(pool)
            moved[sigma] = pool
            j = BATCH_ALONE
            if op in ("recurrent", "chunked"):
                cu = x["cu_seqlens"]
                rows = np.arange(cu[j], cu[j + 1])
                alone_cell = cell_of(op, dict(_SHAPE, lens=(len(rows),), act="bfloat16",
                                              **({"interval": 1} if op == "recurrent" else {"split": None})))
                alone = {**x, **{n: x[n][rows] for n in ("q", "k", "v", "g", "beta")},
                         "cu_seqlens": np.array([0, len(rows)], np.int32), "state": moved,
                         "state_indices": np.array([sigma[x["state_indices"][j]]], np.int32)}
                slots = [x["state_indices"][j]]
            elif op == "decode":
                rows = np.array([j])
                alone_cell = cell_of(op, dict({k: v for k, v in _SHAPE.items() if k != "K"}, KV=(64, 64), N=1,
                                              act="bfloat16"))
                alone = {**x, **{n: x[n][rows] for n in ("q", "k", "v", "a", "b")}, "state": moved,
                         "state_indices": np.array([sigma[x["state_indices"][j]]], np.int32)}
                slots = [x["state_indices"][j]]
            else:
                cu = x["cu_seqlens"]
                rows = np.arange(cu[j], cu[j + 1])
                alone_cell = cell_of(op, dict(_SHAPE, drafts=(len(rows),), accepted="1", act="bfloat16"))
                alone = {**x, **{n: x[n][rows] for n in ("q", "k", "v", "a", "b")}, "state": moved,
                         "spec_state_indices": sigma[x["spec_state_indices"][j:j + 1]].astype(np.int32),
                         "num_accepted_tokens": x["num_accepted_tokens"][j:j + 1],
                         "cu_seqlens": np.array([0, len(rows)], np.int32)}
                slots = list(x["spec_state_indices"][j])
            second = self.run(alone_cell, alone)
            spliced = {"o": np.array(first["o"], copy=True), "state": np.array(first["state"], copy=True)}
            spliced["o"][rows] = second["o"]
            for s in slots:
                spliced["state"][s] = second["state"][sigma[s]]
            parts = [("o", rows)] + [("state", s) for s in slots]
            per_op[op] = self.verdict(cell, x, first, spliced, parts)
        return self._result(per_op, "no pool op")

    def split(self) -> dict:
        op = self.prefill_op()
        if op is None:
            return {"verdict": "n/a", "reason": "no prefill op (chunked or recurrent) it runs", "ops": {}}
        cell = base_cell(op)
        if self.supported(cell):
            return {"verdict": "n/a", "reason": self.supported(cell), "ops": {}}
        x = self.family.make_inputs(cell)
        T, HV = x["q"].shape[0], x["v"].shape[1]
        gate_args = gdn_inputs.gate_inputs(np.random.default_rng(11), "weak", T, HV, "bfloat16")
        g, beta = self.gates(gate_args)
        x = {**x, "g": np.asarray(g, np.float32), "beta": np.asarray(beta, np.float32)}
        first = self.run(cell, x)
        cu, idx, lens = x["cu_seqlens"], x["state_indices"], np.diff(x["cu_seqlens"])
        head = np.concatenate([np.arange(cu[n], cu[n + 1] - SPLIT_K) for n in range(len(lens))])
        o = np.zeros_like(np.asarray(first["o"], np.float32))
        _, _, out = self.prefill(op, *(x[n][head] for n in ("q", "k", "v")), x["g"][head], x["beta"][head],
                                 lens - SPLIT_K, x["state"], idx)
        o[head], pool = out["o"], out["state"]
        for step in range(SPLIT_K):
            rows = cu[1:] - SPLIT_K + step
            if "decode" in self.ops:
                dcell = cell_of("decode", dict({k: v for k, v in _SHAPE.items() if k != "K"}, KV=(64, 64),
                                               N=len(rows), act="bfloat16"))
                out = self.run(dcell, {**{n: x[n][rows] for n in ("q", "k", "v")},
                                       **{n: gate_args[n][rows] for n in ("a", "b")},
                                       "A_log": gate_args["A_log"], "dt_bias": gate_args["dt_bias"], "state": pool,
                                       "state_indices": idx, "steps": 1, "scale": None, "use_qk_l2norm": True,
                                       "l2norm_eps": 1e-6, "state_dtype": "float32"})
                o[rows], pool = out["o"], out["state"]
            else:
                _, _, out = self.prefill(op, *(x[n][rows] for n in ("q", "k", "v")), x["g"][rows], x["beta"][rows],
                                         np.ones(len(rows), int), pool, idx)
                o[rows], pool = out["o"], out["state"]
        spliced = {"o": o.astype(np.asarray(first["o"]).dtype), "state": np.asarray(pool, np.float32)}
        parts = [("o", slice(None)), ("state", slice(None))]
        how = "decode" if "decode" in self.ops else f"one-token {op}"
        return self._result({f"{op}+{how}": self.verdict(cell, x, first, spliced, parts)}, "")

    def rollback(self) -> dict:
        op = self.prefill_op()
        if "spec_decode" not in self.ops or op is None:
            return {"verdict": "n/a", "reason": "needs spec_decode and a prefill op", "ops": {}}
        cell = base_cell("spec_decode")
        if self.supported(cell):
            return {"verdict": "n/a", "reason": self.supported(cell), "ops": {}}
        x = self.family.make_inputs(cell)
        first = self.run(cell, x)
        g, beta = self.gates(x)
        cu, spec = x["cu_seqlens"], x["spec_state_indices"]
        per = {}
        for a in ROLLBACK_ACCEPTED:     # checked as the prefill's cell: its model's bound is the looser
            rows = np.concatenate([np.arange(cu[n], cu[n] + a) for n in range(len(cu) - 1)])
            pcell, px, fresh = self.prefill(op, *(x[n][rows] for n in ("q", "k", "v")), g[rows], beta[rows],
                                            np.full(len(cu) - 1, a), x["state"], spec[:, 0])
            spliced = {"o": np.asarray(first["o"])[rows].astype(np.asarray(fresh["o"]).dtype),
                       "state": np.array(fresh["state"], copy=True)}
            spliced["state"][spec[:, 0]] = np.asarray(first["state"])[spec[:, a - 1]]
            parts = [("o", slice(None))] + [("state", s) for s in spec[:, 0]]
            per[f"accepted={a}"] = self.verdict(pcell, px, fresh, spliced, parts)
        return self._result(per, "")

    def determinism(self) -> dict:
        per_op = {}
        for op, cell in self._pool_ops(per_op):
            x = self.family.make_inputs(cell)
            first, second = self.run(cell, x), self.run(cell, x)
            per_op[op] = self.verdict(cell, x, first, second, [("o", slice(None)), ("state", slice(None))])
        return self._result(per_op, "no pool op")

    @staticmethod
    def _result(per_op: dict, empty_reason: str) -> dict:
        verdict = worst(per_op.values())
        out = {"verdict": verdict, "ops": per_op}
        if verdict == "n/a":
            out["reason"] = empty_reason or "no op ran"
        return out

    def all(self) -> dict:
        """Every relation; one that raises is an ``error`` naming the exception."""
        out = {}
        for name in RELATIONS:
            try:
                out[name] = getattr(self, name)()
            except Exception as exc:
                out[name] = {"verdict": "error", "reason": f"{type(exc).__name__}: {str(exc)[:300]}", "ops": {}}
        return out


def every_relation(backend_name: str) -> dict:
    """The GDN relations and the TurboQuant ones (``conformance.turboquant_relations``) of one
    backend; those of a family it does not implement are ``n/a``."""
    from conformance.turboquant_relations import RELATIONS as TQ_RELATIONS, TurboQuantRelations

    backend = registry.get(backend_name)
    ok, why = backend.available()
    out = {}
    for family, names, runner in (("gdn", RELATIONS, Relations), ("turboquant", TQ_RELATIONS, TurboQuantRelations)):
        reason = f"unavailable: {why}" if not ok else None if family in backend.ops else f"no {family} ops"
        if reason:
            out.update({name: {"verdict": "n/a", "reason": reason, "ops": {}} for name in names})
        else:
            out.update(runner(backend_name).all())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m conformance.relations BACKEND", file=sys.stderr)
        return 2
    print(json.dumps({"backend": argv[0], "relations": every_relation(argv[0])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
