"""TurboQuant check. Store ops: the cache field by field against the NumPy reference store (bytes
no written (slot, head) owns untouched; codes under ``STORE_CODES``; fp16 scalars under
``STORE_FP16``; where a forgiven key-code flip happened in an SoA norm-corrected slot, the expected
k_norm is the one folded with the stored codes). Decode ops: the output against the oracle of the
rounding model; the output may be float32 or the activation dtype (any other dtype fails, naming it), a
16-bit one judged with ``OUTPUT_ROUNDING`` added; quality reports the preset's quantization error (not for
"act-sdpa", which never reads the quantized cache, nor for a captured cache, which comes without its
unquantized keys and values). store_decode decodes the backend's own stored cache.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell
from conformance.compare import EXACT, Comparison, Tolerance, Verdict, compare, dtype_refused, verdict
from conformance.families.turboquant.models import model
from conformance.families.turboquant.oracle import (DEQUANTIZED, act_of, decode_oracle, dequantized_vs_unquantized,
                                                    expected_cache, folded_norm)
from conformance.families.turboquant.tolerances import (QUANT_ERROR, STORE_CODES, STORE_FP16, output_rounding,
                                                        quant_bound, ties)
from conformance.memo import Memo
from conformance.numerics import fp16_ordinal
from reference.turboquant import layout as tq_layout
from reference.turboquant import numpy_ref
from reference.turboquant.presets import preset as lookup


def check_store(cell: Cell, inputs: dict, actual, memo: Memo) -> list[Comparison]:
    """The comparisons of a stored cache against the reference store's."""
    expected = memo.get(cell, inputs, "turboquant-cache", lambda: expected_cache(inputs))
    actual = np.asarray(actual)
    if actual.shape != expected.shape or actual.dtype != np.uint8:
        return [Comparison("kv_cache", False, f"kv_cache: {actual.dtype} {list(actual.shape)}, expected "
                           f"uint8 {list(expected.shape)}", {"max_abs": float("inf")}, EXACT)]
    p, lay = lookup(inputs["preset"]), inputs["layout"]
    _, bs, Hk, _ = expected.shape
    D = inputs["key"].shape[-1]
    slots = inputs["slot_mapping"][inputs["slot_mapping"] >= 0]
    owned = np.zeros(expected.size, dtype=bool)
    offs = tq_layout.field_offsets(p, D, Hk, bs, lay, slots[:, None], np.arange(Hk))
    for name, n in tq_layout.field_sizes(p, D).items():
        owned[tq_layout.byte_indices(offs[name], n)] = True
    got = numpy_ref.read_fields(actual, slots, p, lay, D)
    want = numpy_ref.read_fields(expected, slots, p, lay, D)
    near = ties(inputs, p)
    out = [compare("untouched_bytes", actual.reshape(-1)[~owned], expected.reshape(-1)[~owned], EXACT)]
    for name in ("key_codes", "value_codes"):
        g, w = got[name].astype(np.int64), want[name].astype(np.int64)
        forgiven = near[name] & (np.abs(g - w) == 1)
        out.append(compare(name, np.where(forgiven, w, g), w, STORE_CODES))
    if p.norm_correction and lay == "soa" and "k_norm" in want:
        # the SoA store folds sum(c[idx]^2) into k_norm: a forgiven key-code flip changes it
        flipped = np.any(got["key_codes"] != want["key_codes"], axis=-1)
        want = {**want, "k_norm": np.where(flipped, folded_norm(inputs, got["key_codes"], p), want["k_norm"])}
    for name in ("k_norm", "v_scale", "v_zero"):
        if name in want:
            out.append(compare(name, fp16_ordinal(got[name]), fp16_ordinal(want[name]), STORE_FP16))
    return out


def check_out(inputs: dict, actual, expected, tol: Tolerance) -> Comparison:
    """The decode output against the oracle: float32, or the activation dtype (16-bit: ``tol`` widened by
    ``OUTPUT_ROUNDING``); any other dtype fails, naming it."""
    act = act_of(inputs)
    refused = dtype_refused("out", actual, ("float32", act))
    if refused:
        return refused
    if np.asarray(actual).dtype.name != "float32":
        tol = output_rounding(tol, expected, act)
    return compare("out", actual, expected, tol)


def quality(inputs: dict, cache, G: int) -> dict:
    """Dequantized vs unquantized float64 attention (``QUANT_ERROR``), reported, not gated."""
    deq, ref = dequantized_vs_unquantized(inputs, cache, G)
    bound = quant_bound(inputs["preset"])
    c = compare("quant_error", deq, ref, Tolerance(float("inf"), 0.0, f"{QUANT_ERROR.name}: reported",
                                                   rel_l2=bound, terms=(QUANT_ERROR.name,)))
    return {"quant_error": c.metrics, "quant_bound_rel_l2": bound, "quant_within_bound": c.passed}


def check(cell: Cell, rounding_model: str, inputs: dict, outputs: dict, memo: Memo | None = None) -> Verdict:
    """Compare ``outputs`` with the oracle of ``rounding_model`` (a name of ``models.MODELS``).

    ``inputs`` are the pristine inputs; ``memo`` keeps oracles across calls (None: a fresh one).
    """
    m = model(rounding_model)
    memo = Memo() if memo is None else memo
    comparisons, report = [], {}
    cache = inputs["kv_cache"]
    if cell.op in ("store", "store_decode"):
        comparisons += check_store(cell, inputs, outputs["kv_cache"], memo)
        cache = np.asarray(outputs["kv_cache"])  # the decode is judged on the backend's own store
    if cell.op in ("decode", "store_decode"):
        G = cell["G"]
        # store_decode: the oracle depends on the backend's cache, which the key therefore holds
        depends = None if cell.op == "decode" else cache
        expected, tol = memo.get(cell, inputs, ("turboquant-decode", rounding_model, depends),
                                 lambda: decode_oracle(m, cell.op, inputs, cache, G))
        comparisons.append(check_out(inputs, outputs["out"], expected, tol))
        # an oracle of the unquantized cache has no quality, nor has a captured cache (no unquantized keys)
        if m.oracle_on(cell.op, DEQUANTIZED).quantized and "key_cache" in inputs:
            report = memo.get(cell, inputs, ("turboquant-quality", depends), lambda: quality(inputs, cache, G))
    return verdict(comparisons, report)
