"""Properties of the GDN references (numpy_ref, jax_ref): agreement, algebra, rounding, slots."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import reference.gdn.jax_ref as jax_ref
import reference.gdn.numpy_ref as numpy_ref
from conformance.cells import make_cell
from conformance.families import gdn
from conformance.families.gdn.models import MODELS
from conformance.families.gdn.tolerances import gating, o_and_state
from conformance.numerics import UBF16, bf16_round, rel_l2
from conformance.testing import assert_close

BF16 = np.dtype(ml_dtypes.bfloat16)


def _agree(cell, inputs, actual: dict, expected: dict, model="exact", compute="float32"):
    """``actual`` and ``expected`` (o, state) agree within twice the family's bound of each vs the oracle."""
    expected = {n: np.asarray(x, np.float32) for n, x in expected.items()}
    o_tol, s_tol = o_and_state(cell, inputs, expected, MODELS[model], compute)
    assert_close("o", actual["o"], expected["o"], o_tol.between_two())
    assert_close("state", actual["state"], expected["state"], s_tol.between_two())


def _cell(op, **kw):
    base = dict(state="float32", H=2, HV=6, K=32)
    if op in ("recurrent", "chunked"):
        base.update(lens=(70, 5, 131), decay="weak", slots="padded")
        base.update(interval=1) if op == "recurrent" else base.update(split=None)
    elif op == "decode":
        base.update(V=16, N=5, decay="weak", slots="padded")
    else:
        base.update(drafts=(3, 1, 4), accepted="mix", decay="weak", slots="padded")
    base.update(kw)
    return make_cell("gdn", op, **base)


def _run(impl, cell, **overrides):
    inputs = {**gdn.make_inputs(cell), **overrides}
    return gdn.run_with(impl, cell, {**inputs, "state": inputs["state"].copy()}), inputs


@pytest.mark.parametrize("op", ["recurrent", "chunked", "decode", "spec_decode"])
def test_numpy_and_jax_agree_with_float32_state(op):
    cell = _cell(op)
    a, inputs = _run(numpy_ref, cell)
    b, _ = _run(jax_ref, cell)
    _agree(cell, inputs, b, a)


def test_numpy_and_jax_gating_agree():
    cell = make_cell("gdn", "gating", HV=12, T=65)
    a, inputs = _run_gating(numpy_ref, cell)
    b, _ = _run_gating(jax_ref, cell)
    for name, tol in zip(("g", "beta"), gating(cell, inputs, MODELS["exact"])):
        assert_close(name, b[name], a[name], tol.between_two())


def _run_gating(impl, cell):
    inputs = gdn.make_inputs(cell)
    return gdn.run_with(impl, cell, inputs), inputs


def test_gating_formula_and_softplus_threshold():
    A_log = np.array([0.0, np.log(2.0)], np.float32)
    a = np.array([[25.0, -25.0], [0.0, 1.0]], np.float32)
    dt_bias = np.zeros(2, np.float32)
    b = np.array([[0.0, 2.0], [-3.0, 40.0]], np.float32)
    g, beta = numpy_ref.gating(A_log, a, b, dt_bias)
    softplus = np.array([[25.0, np.exp(-25.0)], [np.log(2.0), np.log1p(np.e)]])
    g_tol, beta_tol = gating(make_cell("gdn", "gating", HV=2, T=2, act="float32"),
                             {"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias}, MODELS["exact"])
    assert_close("g", g, -np.exp(A_log.astype(np.float64)) * softplus, g_tol)
    assert_close("beta", beta, 1 / (1 + np.exp(-b.astype(np.float64))), beta_tol)


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_chunked_equals_recurrent(impl):
    """Float32 state: the UT/WY chunk algebra equals the token recurrence (up to fp32 rounding)."""
    cell = _cell("chunked", decay="strong")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pools = [inputs["state"].copy(), inputs["state"].copy()]
    out_c = impl.chunked(*args, pools[0], inputs["state_indices"])
    out_r = impl.recurrent(*args, pools[1], inputs["state_indices"])
    (o_c, s_c), (o_r, s_r) = [(r, p) if not isinstance(r, tuple) else r
                              for r, p in ((out_c, pools[0]), (out_r, pools[1]))]
    _agree(cell, inputs, {"o": o_c, "state": s_c}, {"o": o_r, "state": s_r})


def test_chunked_equals_recurrent_in_float64():
    """In float64 the two forms agree to ~1e-12, so the chunk algebra has no approximation."""
    cell = _cell("chunked", decay="zero")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    p1, p2 = inputs["state"].copy(), inputs["state"].copy()
    o_c = numpy_ref.chunked(*args, p1, inputs["state_indices"], compute_dtype="float64")
    o_r = numpy_ref.recurrent(*args, p2, inputs["state_indices"], compute_dtype="float64")
    _agree(cell, inputs, {"o": o_c, "state": p1}, {"o": o_r, "state": p2}, compute="float64")


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_two_call_split_equals_one_call_with_float32_state(impl):
    cell = _cell("chunked", split=None)
    one, inputs = _run(impl, cell)
    two, _ = _run(impl, cell, split=37)
    _agree(cell, {**inputs, "split": 37}, two, one)


def test_bf16_state_interval_64_differs_from_interval_1():
    cell = _cell("recurrent", state="bfloat16")
    a, _ = _run(numpy_ref, cell, state_write_interval=1)
    b, _ = _run(numpy_ref, cell, state_write_interval=64)
    assert rel_l2(a["state"], b["state"]) > UBF16 / 64     # more roundings, more drift
    assert rel_l2(a["o"], b["o"]) > UBF16 / 512


def test_bf16_state_store_is_round_to_nearest_even():
    """The stored state equals an independent bit-level RNE of the fp32 state."""
    cell = _cell("recurrent", lens=(9,), slots="shuffled")
    inputs = gdn.make_inputs(cell)
    pool16 = inputs["state"].astype(BF16)
    pool32 = pool16.astype(np.float32)              # the same starting values
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    numpy_ref.recurrent(*args, pool32, inputs["state_indices"], state_write_interval=64)
    numpy_ref.recurrent(*args, pool16, inputs["state_indices"], state_dtype="bfloat16",
                        state_write_interval=64)   # 9 tokens: rounded once, at the end
    slot = inputs["state_indices"][0]
    bits = pool32[slot].view(np.uint32).astype(np.uint64)
    rne = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # the fp32 pool holds the same fp32 value the bf16 path rounds (same math, same order)
    np.testing.assert_array_equal(pool16[slot].view(np.uint16), rne)


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_padding_slots_and_unused_slots_untouched(impl):
    cell = _cell("recurrent", state="float16")
    out, inputs = _run(impl, cell)
    idx = inputs["state_indices"]
    assert (idx == -1).any()
    unused = np.setdiff1d(np.arange(inputs["state"].shape[0]), idx[idx >= 0])
    np.testing.assert_array_equal(out["state"][unused], inputs["state"][unused].astype(np.float32))
    cu = inputs["cu_seqlens"]
    n = int(np.flatnonzero(idx == -1)[0])
    assert not out["o"][cu[n]:cu[n + 1]].any()


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_spec_decode_resumes_from_last_accepted_slot_and_writes_each_token(impl):
    """spec_decode equals decode run token by token from slot spec[n, max(acc-1, 0)]."""
    cell = _cell("spec_decode", state="bfloat16")
    out, inputs = _run(impl, cell)
    pool = inputs["state"].copy()
    spec, acc, cu = inputs["spec_state_indices"], inputs["num_accepted_tokens"], inputs["cu_seqlens"]
    expected_o = np.zeros_like(out["o"])
    for n in range(len(acc)):
        prev = spec[n, max(acc[n] - 1, 0)]
        if prev < 0:
            continue
        for t, i in enumerate(range(cu[n], cu[n + 1])):
            pool[spec[n, t]] = pool[prev]            # decode reads and writes the same slot
            tok = {name: inputs[name][i:i + 1] for name in ("q", "k", "v", "a", "b")}
            expected_o[i] = numpy_ref.decode(tok["q"], tok["k"], tok["v"], inputs["A_log"], tok["a"],
                                             tok["b"], inputs["dt_bias"], pool,
                                             np.array([spec[n, t]], np.int32),
                                             state_dtype="bfloat16")[0]
            prev = spec[n, t]
    _agree(cell, inputs, out, {"o": expected_o, "state": pool})


def test_bf16_operand_model_changes_chunked_by_about_bf16_epsilon():
    cell = _cell("chunked")
    exact, _ = _run(numpy_ref, cell)
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pool = inputs["state"].copy()
    o = numpy_ref.chunked(*args, pool, inputs["state_indices"], operand_dtype="bfloat16")
    err = rel_l2(o, exact["o"])
    assert UBF16 / 32 < err < 4 * UBF16                     # about u_bf16, far from u32


def test_fla_rounding_points_round_o_and_reject_bad_arguments():
    cell = _cell("chunked")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    o = numpy_ref.chunked(*args, inputs["state"].copy(), inputs["state_indices"], operand_dtype="bfloat16",
                          rounding_points="fla")
    assert np.array_equal(o, bf16_round(o)) and np.any(o != 0)
    with pytest.raises(ValueError, match="rounding_points"):
        numpy_ref.chunked(*args, inputs["state"].copy(), inputs["state_indices"], rounding_points="fla")
    with pytest.raises(ValueError, match="rounding_points"):
        numpy_ref.chunked(*args, inputs["state"].copy(), inputs["state_indices"], operand_dtype="bfloat16",
                          rounding_points="tf32")


@pytest.mark.parametrize("C", [64, 37, 1])
def test_fla_inverse_is_the_inverse_up_to_tf32_truncation(C):
    rng = np.random.default_rng(C)
    k = rng.standard_normal((3, C, 16)) / 4
    A = np.tril(-k @ k.transpose(0, 2, 1), -1)
    want = numpy_ref._unit_lower_inverse(A)
    got = numpy_ref._fla_unit_lower_inverse(A)
    first = np.s_[..., :16, :16]                            # the first diagonal block: substitution, no TF32
    assert np.allclose(got[first], want[first], rtol=1e-12, atol=1e-12)
    err = rel_l2(got, want)
    assert err < 4 * 2.0**-10 and (C <= 16 or err > 2.0**-16)   # truncated operands, not a wrong merge
    assert np.array_equal(numpy_ref._tf32(np.array([1 + 2.0**-10 + 2.0**-11])), np.array([1 + 2.0**-10]))


def test_numpy_and_jax_agree_on_the_bf16_operand_model():
    cell = _cell("chunked", state="bfloat16")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pool = inputs["state"].copy()
    o_np = numpy_ref.chunked(*args, pool, inputs["state_indices"], state_dtype="bfloat16",
                             operand_dtype="bfloat16")
    o_jx, pool_jx = jax_ref.chunked(*args, inputs["state"], inputs["state_indices"],
                                    state_dtype="bfloat16", operand_dtype="bfloat16")
    # only rounding-tie flips of bf16 operands separate them (different solve and sum order)
    _agree(cell, inputs, {"o": o_jx, "state": pool_jx}, {"o": o_np, "state": pool}, model="bf16-operands")


def test_strong_decay_with_g_minus_50_stays_finite_in_chunks():
    """exp(G_i - G_j) is computed directly: a chunk whose cumulative g passes -88 gives no NaN."""
    cell = _cell("chunked", decay="strong", lens=(64,), slots="shuffled")
    inputs = gdn.make_inputs(cell)
    inputs["g"][:] = -50.0
    out, _ = _run(numpy_ref, cell, g=inputs["g"])
    assert np.isfinite(out["o"]).all() and np.isfinite(out["state"]).all()
    out_j, _ = _run(jax_ref, cell, g=inputs["g"])
    assert np.isfinite(out_j["o"]).all()


def test_float64_jax_matches_float64_numpy():
    cell = _cell("recurrent", state="bfloat16", interval=16)
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    kw = dict(state_dtype="bfloat16", state_write_interval=16, compute_dtype="float64")
    pool = inputs["state"].copy()
    o_np = numpy_ref.recurrent(*args, pool, inputs["state_indices"], **kw)
    o_jx, pool_jx = jax_ref.recurrent(*args, inputs["state"], inputs["state_indices"], **kw)
    _agree(cell, {**inputs, "state_write_interval": 16}, {"o": o_jx, "state": pool_jx}, {"o": o_np, "state": pool},
           compute="float64")


@pytest.mark.parametrize("segment_chunks", [1, 2])
def test_segments_merged_from_affine_maps_equal_the_chunks_in_order_in_float64(segment_chunks):
    """Without operand roundings the segments' maps compose exactly: in float64 the segmented form agrees with
    the chunks in order to ~1e-12 (lens 70, 5, 131: 2 and 3 chunks, so segments of 1 and 2 chunks split them)."""
    cell = _cell("chunked", decay="zero")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    p1, p2 = inputs["state"].copy(), inputs["state"].copy()
    o_s = numpy_ref.chunked(*args, p1, inputs["state_indices"], compute_dtype="float64",
                            segment_chunks=segment_chunks)
    o_c = numpy_ref.chunked(*args, p2, inputs["state_indices"], compute_dtype="float64")
    _agree(cell, inputs, {"o": o_s, "state": p1}, {"o": o_c, "state": p2}, compute="float64")


def test_segments_with_bf16_operands_differ_from_the_chunks_in_order_and_one_segment_is_the_same():
    cell = _cell("chunked", state="bfloat16")
    inputs = gdn.make_inputs(cell)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pools = [inputs["state"].copy() for _ in range(3)]
    run = [numpy_ref.chunked(*args, pool, inputs["state_indices"], state_dtype="bfloat16", operand_dtype="bfloat16",
                             segment_chunks=n) for pool, n in zip(pools, (None, 3, 1))]
    assert np.array_equal(run[0], run[1]) and np.array_equal(pools[0], pools[1])     # every sequence one segment
    err = rel_l2(run[2], run[0])
    assert 0 < err < 4 * UBF16                               # the dropped roundings: about u_bf16 or less
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="^segment_chunks"):
            numpy_ref.chunked(*args, inputs["state"].copy(), inputs["state_indices"], state_dtype="bfloat16",
                              segment_chunks=bad)
    with pytest.raises(ValueError, match="^segment_chunks"):
        numpy_ref.chunked(*args, inputs["state"].copy(), inputs["state_indices"], state_dtype="bfloat16",
                          operand_dtype="bfloat16", rounding_points="fla", segment_chunks=2)
