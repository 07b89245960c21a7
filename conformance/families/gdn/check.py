"""GDN check: a backend's outputs against the oracle of its rounding model.

gating: g and beta under ``GATING``. Other ops: ``o`` (float32 or the cell's activation dtype, any
other dtype fails; a 16-bit o against the oracle's o rounded once to it) on the rows of real sequences
(the rows of padding sequences: any finite value), ``state`` on the slots the op writes, and the other slots bit-identical (``compare.identical``:
NaN left in a slot no one reads passes). Quality: the error against the same
run with a float32 state pool (float64 recurrent).
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell, activation
from conformance.compare import Comparison, Verdict, compare, dtype_refused, finite, identical, verdict
from conformance.families.gdn.models import model, oracle_kind
from conformance.families.gdn.oracle import ORACLES, oracle
from conformance.families.gdn.tolerances import UNTOUCHED_TOL, gating, o_and_state, output_rounded, rounded_once
from conformance.memo import Memo
from conformance.numerics import rel_l2


def real_sequences(cell: Cell, inputs: dict) -> np.ndarray:
    """Indices of the non-padding sequences (decode: of the tokens)."""
    if cell.op == "spec_decode":
        spec, acc = inputs["spec_state_indices"], inputs["num_accepted_tokens"]
        return np.flatnonzero(spec[np.arange(len(acc)), np.maximum(acc - 1, 0)] >= 0)
    return np.flatnonzero(inputs["state_indices"] >= 0)


def real_rows(cell: Cell, inputs: dict) -> np.ndarray:
    """Token rows of ``o`` that belong to non-padding sequences (a decode chain: in every call)."""
    real = real_sequences(cell, inputs)
    if cell.op == "decode":
        N = len(inputs["state_indices"])
        return np.concatenate([real + s * N for s in range(inputs.get("steps", 1))])
    cu = inputs["cu_seqlens"]
    return np.concatenate([np.arange(cu[n], cu[n + 1]) for n in real])


def written_slots(cell: Cell, inputs: dict) -> np.ndarray:
    """Pool slots the op stores into (sorted)."""
    if cell.op == "spec_decode":
        cu, spec = inputs["cu_seqlens"], inputs["spec_state_indices"]
        slots = np.concatenate([spec[n, : cu[n + 1] - cu[n]] for n in real_sequences(cell, inputs)])
        return np.sort(slots).astype(np.int64)
    idx = inputs["state_indices"]
    return np.sort(idx[idx >= 0]).astype(np.int64)


def check(cell: Cell, rounding_model: str, inputs: dict, outputs: dict, memo: Memo | None = None) -> Verdict:
    """Compare ``outputs`` with the oracle of ``rounding_model`` (a name of ``models.MODELS``).

    ``inputs`` are the pristine inputs; ``memo`` keeps oracles across calls (None: a fresh one).
    """
    memo = Memo() if memo is None else memo
    kind = oracle_kind(cell, rounding_model)
    expected = oracle(cell, inputs, kind, memo)
    source = f"{ORACLES[kind].words(cell)}; backend rounding model {rounding_model}"
    if cell.op == "gating":
        g_tol, beta_tol = gating(cell, inputs, model(rounding_model))
        comps = [compare("g", outputs["g"], expected["g"], g_tol),
                 compare("beta", outputs["beta"], expected["beta"], beta_tol)]
        return verdict(comps, {"oracle": source})
    missing = {"o", "state"} - set(outputs)
    if missing:
        raise ValueError(f"outputs: missing {sorted(missing)} for gdn/{cell.op}")
    refused = dtype_refused("o", outputs["o"], ("float32", activation(cell)))
    if refused:
        return verdict([refused], {"oracle": source})
    rows = real_rows(cell, inputs)
    written = written_slots(cell, inputs)
    o_dtype = outputs["o"].dtype.name
    o_tol, s_tol = o_and_state(cell, inputs, expected, model(rounding_model), written=written, memo=memo,
                               o_dtype=o_dtype, rows=rows)
    want_o = expected["o"][rows]
    if output_rounded(cell, model(rounding_model), o_dtype):    # rounded once, as the kernel must
        want_o = rounded_once(want_o, o_dtype)
    untouched = np.setdiff1d(np.arange(inputs["state"].shape[0]), written)
    comps: list[Comparison] = [
        compare("o", outputs["o"][rows], want_o, o_tol),
        compare("state", outputs["state"][written], expected["state"][written], s_tol),
        identical("untouched_slots", outputs["state"][untouched], inputs["state"][untouched], UNTOUCHED_TOL),
    ]
    padding = np.setdiff1d(np.arange(outputs["o"].shape[0]), rows)
    if padding.size:
        comps.append(finite("o_padding_rows", outputs["o"][padding]))
    same = inputs["state_dtype"] == "float32" and kind == "exact"
    fp32 = expected if same else oracle(cell, inputs, "exact", memo, fp32_state=True)
    quality = {
        "oracle": source,
        "o_rel_l2_vs_fp32_state": rel_l2(outputs["o"][rows], fp32["o"][rows]),
        "state_rel_l2_vs_fp32_state": rel_l2(outputs["state"][written], fp32["state"][written]),
    }
    return verdict(comps, quality)
