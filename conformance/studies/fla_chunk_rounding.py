"""`kernel-lab study fla-chunk-rounding`: FLA's chunk form emulated in NumPy with FLA's bf16 roundings.

fla-core 0.6.0's ``chunk_gated_delta_rule`` rounds to bf16 where the gdn ``bf16-operands`` model does
not (``conformance.backends.fla_gdn.CHUNK_ROUNDING``): the output o; q and k straight out of the l2
norm, with the scale and exp(g) applied to fp32 dot products; the state increment's
bf16(v_new exp(g_last - g)) from the unrounded v_new. Where both round (A = (I + M)^-1, w, u, the
chunk-start state h, v_new for the readout) the emulation rounds too; everything else is float64.

For each fla chunked cell a record ran (default: the H200 run, reports/baselines/h200/peers_full_cells.jsonl),
the emulation's outputs go through the gdn check against the ``bf16-operands`` oracle: its verdict and
o / state rel_l2, beside the recorded ones, and the o rel_l2 of the emulation with an unrounded output
(what placements (2) and (3) cost alone), as fractions of the cell's o bound.
"""
from __future__ import annotations

import json
import os
import types

import ml_dtypes
import numpy as np

NAME = "fla-chunk-rounding"
DESCRIPTION = ("FLA's chunk form emulated with its bf16 roundings (output, q/k after the l2 norm, the state "
               "increment), checked against the bf16-operands oracle beside a record of the real FLA")
RECORD = os.path.join("reports", "baselines", "h200", "peers_full_cells.jsonl")


def add_arguments(parser) -> None:
    parser.add_argument("--record", default=RECORD, help=f"a cells.jsonl with fla chunked records (default {RECORD})")
    parser.add_argument("--filter", default="", help="only cells whose id contains this")


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def fla_chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
                l2norm_eps=1e-6, state_dtype="float32", chunk_size=64, round_output=True):
    """The chunked op (reference contract: state updated in place, returns o [T, HV, V] float32) with FLA's
    roundings; the state is rounded into the pool's dtype once per call, as the adapter stores it."""
    from reference.gdn.numpy_ref import _unit_lower_inverse

    T, H, K = q.shape
    HV = v.shape[1]
    scale = 1.0 / np.sqrt(K) if scale is None else scale

    def norm(x):
        x = np.asarray(x, np.float64)
        x = x / np.sqrt((x * x).sum(-1, keepdims=True) + l2norm_eps) if use_qk_l2norm else x
        return np.repeat(_bf16(x), HV // H, axis=1)

    qn, kn = norm(q), norm(k)
    v, g, beta = (np.asarray(x, np.float64) for x in (v, g, beta))
    o = np.zeros(v.shape, np.float32)
    for n in np.flatnonzero(np.asarray(state_indices) >= 0):
        S = state[state_indices[n]].astype(np.float64)
        for c0 in range(cu_seqlens[n], cu_seqlens[n + 1], chunk_size):
            c1 = min(c0 + chunk_size, cu_seqlens[n + 1])
            qc, kc, vc = (x[c0:c1].transpose(1, 0, 2) for x in (qn, kn, v))
            G, bc = np.cumsum(g[c0:c1].T, axis=1), beta[c0:c1].T[:, :, None]
            lower = np.tril(np.ones((c1 - c0,) * 2, bool))
            D = np.exp(np.where(lower, G[:, :, None] - G[:, None, :], -np.inf))
            A = np.where(np.tril(lower, -1), -bc * (kc @ kc.transpose(0, 2, 1)) * D, 0.0)
            Tm = _bf16(_unit_lower_inverse(A))
            eG = np.exp(G)[:, :, None]
            W, U = _bf16(Tm @ _bf16(bc * eG * kc)), _bf16(Tm @ _bf16(bc * vc))
            h = _bf16(S)
            v_new = U - W @ h
            oc = scale * (qc @ h) * eG + scale * (_bf16((qc @ kc.transpose(0, 2, 1)) * D) @ _bf16(v_new))
            o[c0:c1] = (_bf16(oc) if round_output else oc).transpose(1, 0, 2)
            increment = _bf16(v_new * np.exp(G[:, -1:] - G)[:, :, None])
            S = np.exp(G[:, -1])[:, None, None] * S + kc.transpose(0, 2, 1) @ increment
        state[state_indices[n]] = S.astype(np.float32).astype(state.dtype)
    return o


def cell_row(cell, recorded: dict) -> dict:
    """The emulation of one fla chunked cell beside its record."""
    from conformance.families.gdn.check import check, real_rows, written_slots
    from conformance.families.gdn.driver import run_with
    from conformance.families.gdn.inputs import make_inputs
    from conformance.families.gdn.oracle import oracle
    from conformance.families.gdn.tolerances import o_and_state
    from conformance.memo import Memo
    from conformance.numerics import rel_l2

    inputs = make_inputs(cell)

    def emulate(round_output):
        impl = types.SimpleNamespace(chunked=lambda *a, **kw: fla_chunked(*a, **kw, round_output=round_output))
        return run_with(impl, cell, {**inputs, "state": inputs["state"].copy()})

    memo = Memo()
    expected = oracle(cell, inputs, "bf16-operands", memo)
    o_tol, _ = o_and_state(cell, inputs, expected, "bf16-operands")
    rows, slots = real_rows(cell, inputs), written_slots(cell, inputs)
    full, unrounded = emulate(True), emulate(False)
    return {"id": cell.id, "recorded": recorded["status"], "recorded_reason": recorded["reason"],
            "emulated": check(cell, "bf16-operands", inputs, full, memo).status,
            "o_rel_l2": rel_l2(full["o"][rows], expected["o"][rows]),
            "state_rel_l2": rel_l2(full["state"][slots], expected["state"][slots]),
            "o_bound": o_tol.rel_l2,
            "o_unrounded_output_rel_l2": rel_l2(unrounded["o"][rows], expected["o"][rows])}


def run(args) -> dict:
    from conformance.cells import make_cell

    with open(args.record) as f:
        records = [json.loads(line) for line in f]
    rows = [cell_row(make_cell("gdn", "chunked", seed=r["seed"], **r["params"]), r) for r in records
            if r["backend"] == "fla" and r["op"] == "chunked" and r["status"] in ("pass", "fail")
            and args.filter in r["id"]]
    return {"study": NAME, "record": args.record, "cells": rows,
            "agree": sum(r["emulated"] == r["recorded"] for r in rows)}


def summarize(result: dict) -> str:
    lines = [f"{'cell':90s} recorded emulated  o/bound  unrounded-o/bound  state rel_l2"]
    for r in result["cells"]:
        lines.append(f"{r['id'][12:]:90s} {r['recorded']:8s} {r['emulated']:8s} {r['o_rel_l2'] / r['o_bound']:8.3f} "
                     f"{r['o_unrounded_output_rel_l2'] / r['o_bound']:18.3f}  {r['state_rel_l2']:.4f}")
    lines.append(f"verdicts agree in {result['agree']} of {len(result['cells'])} cells ({result['record']})")
    return "\n".join(lines)
