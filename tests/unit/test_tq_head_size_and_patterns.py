"""TurboQuant at head size 96 (the seeded random rotation; a Hadamard or a non-orthogonal rotation refused) and
the adversarial draws: each does what its name says, and each named new ci cell catches the planted bugs listed."""
import numpy as np
import pytest

from conformance.families.turboquant import make_inputs, matrix as M
from conformance.families.turboquant.oracle import dequantized, expected_cache, rotated_query
from conformance.families.turboquant.tolerances import attention_atol, ties
from conformance.memo import Memo
from conformance.numerics import U32
from conformance.testing import PLANTED, first_failing_cell, reference_impl, verdict_of
from reference.turboquant import jax_ref, numpy_ref, quantizers, rotation
from reference.turboquant.presets import preset


def test_head_size_96_takes_the_seeded_random_rotation_in_both_references():
    R = numpy_ref.default_rotation(96)
    assert np.array_equal(R, numpy_ref.random_rotation(96, rotation.DEFAULT_SEED))
    assert np.array_equal(np.asarray(jax_ref.default_rotation(96)), R)
    assert np.abs(R.astype(np.float64) @ R.T - np.eye(96)).max() <= rotation.orthogonality_atol(96)
    assert np.array_equal(numpy_ref.default_rotation(128), numpy_ref.hadamard(128))
    for impl in (numpy_ref, jax_ref):
        with pytest.raises(ValueError, match="power of two.*random rotation"):
            impl.hadamard(96)


def _store(R, D=96):
    p = preset("turboquant_4bit_nc")
    cache = np.zeros((2, 16, 1, p.slot_size(D)), np.uint8)
    kv = np.random.default_rng(0).standard_normal((3, 1, D)).astype(np.float32)
    numpy_ref.store(cache, kv, kv, np.arange(3), p.name, "soa", R)


def test_a_rotation_that_is_not_orthogonal_or_not_d_by_d_is_refused():
    h = numpy_ref.hadamard(128)
    with pytest.raises(ValueError, match=r"rotation must have shape \[96, 96\]"):
        _store(h)  # a next-power-of-two Hadamard for D = 96
    with pytest.raises(ValueError, match="rotation must be orthogonal"):
        _store(h[:96, :96] * np.float32(np.sqrt(128 / 96)))  # a sliced Hadamard: rows no longer orthogonal
    _store(numpy_ref.default_rotation(96))


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_a_key_whose_soa_folded_norm_overflows_float16_is_refused_and_the_aos_store_keeps_it(impl):
    p, D = preset("turboquant_3bit_nc"), 96
    key = np.random.default_rng(1).standard_normal((16, 1, D))
    key = (key / np.linalg.norm(key, axis=-1, keepdims=True) * 65400).astype(np.float32)  # norm below 65504
    R = numpy_ref.default_rotation(D)
    assert quantizers.mse_key_codes(key, p, "soa", R)[1].max() > 65504  # ||k|| / sqrt(sum c^2) is not
    for layout in ("aos", "soa"):
        cache = np.zeros((1, 16, 1, p.slot_size(D)), np.uint8)
        if layout == "aos":
            impl.store(cache, key, key, np.arange(16), p.name, layout, R)
        else:
            with pytest.raises(ValueError, match="key holds a vector whose norm-corrected scalar"):
                impl.store(cache, key, key, np.arange(16), p.name, layout, R)


def test_a_cell_refuses_the_hadamard_at_a_head_size_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two D"):
        M.store_cell("turboquant_4bit_nc", "soa", 2, 16, 17, "hadamard", D=96)
    with pytest.raises(ValueError, match="pattern must be"):
        M.store_cell("turboquant_4bit_nc", "soa", 2, 16, 17, "random", pattern="sorted")


def _cell(tier, pattern):
    return next(c for c in M.adversarial(tier) if c.get("pattern") == pattern)


def _logits(cell):
    x = make_inputs(cell)
    cache = expected_cache(x) if cell.op == "store_decode" else x["kv_cache"]
    keys, values = dequantized(x, cache)
    q = rotated_query(x)
    G = cell["G"]
    return x, [x["scale"] * np.einsum("hd,thd->ht", q[b], np.repeat(k.astype(np.float64), G, axis=1))
               for b, k in enumerate(keys)], values


def test_near_duplicate_keys_tie_in_the_quantizer_and_in_the_softmax():
    x, logits, _ = _logits(_cell("ci", "near-duplicate"))
    assert ties(x, preset(x["preset"]))["key_codes"].mean() > 0.005
    k = x["key"][x["slot_mapping"] >= 0].astype(np.float64)
    assert np.abs(k - k[:1]).max() < 2.0**-9 * np.abs(k).max()  # every row equal up to 2^-12 relative noise
    for s in logits:  # the ties quantize either way: dequantized logits within 0.25, nearly flat weights
        assert np.all(s.max(axis=1) - s.min(axis=1) < 0.25)


def test_aligned_queries_give_a_peaked_softmax():
    for cell in (c for c in M.adversarial("ci") if c.get("pattern") == "aligned"):
        _, logits, _ = _logits(cell)
        for s in logits:
            top = np.sort(s, axis=1)
            assert np.all(top[:, -1] > 19.0) and np.median(top[:, -1] - top[:, -2]) > 10.0


def test_dtype_edge_and_norm_edge_reach_the_float16_range_without_overflowing_the_cache():
    x, logits, values = _logits(_cell("ci", "dtype-edge"))
    assert np.abs(x["query"].astype(np.float32)).max() > 3e4 and max(np.abs(v).max() for v in values) > 5e4
    assert all(np.all(np.isfinite(v)) for v in values) and max(np.abs(s).max() for s in logits) < 20
    x, logits, _ = _logits(_cell("ci", "norm-edge"))
    p = preset(x["preset"])
    fields = numpy_ref.read_fields(expected_cache(x), x["slot_mapping"][x["slot_mapping"] >= 0], p, x["layout"],
                                   x["query"].shape[-1])
    assert 0.5 * 65504 < fields["k_norm"].astype(np.float32).max() < 65504
    assert max(np.abs(s).max() for s in logits) < 20


def test_every_planted_bug_fails_a_d96_ci_cell_that_the_reference_passes():
    cells = [c for c in M.cells("ci") if c["D"] == 96]
    base, memo = reference_impl("turboquant", "exact"), Memo()
    for name, bug in PLANTED.items():
        if bug.family != "turboquant":
            continue
        found = first_failing_cell(bug.plant(base), "turboquant", "exact", [c for c in cells if bug.applies(c)], memo)
        assert found is not None, f"no D=96 ci cell catches {name}"
        assert verdict_of(base, found, "exact", memo).status == "pass", found.id


# A new ci cell -> planted bugs it catches under the "exact" model (each fails it; the reference passes it)
CATCHES = {
    "store/preset=turboquant_4bit_nc/layout=soa/Hk=2/bs=16/ntok=17/rotation=random/D=96/range=unit/act=bfloat16":
        ("nibbles-swapped", "norm-not-corrected"),
    "store/preset=turboquant_k3v4_nc/layout=aos/Hk=2/bs=16/ntok=9/rotation=random/D=96/range=unit/act=float16":
        ("fp16-read-as-bf16",),
    "decode/preset=turboquant_k8v4/layout=soa/Hk=4/G=2/bs=16/lens=9+17/rotation=none/sinks=off/D=96/range=unit/"
    "act=float16": ("soa-read-as-aos", "output-in-bf16"),
    "store_decode/preset=turboquant_4bit_nc/layout=soa/Hk=2/G=6/bs=32/lens=33+1/rotation=random/sinks=off/D=96/"
    "range=unit/act=bfloat16": ("norm-correction-twice", "query-rotated-by-transpose"),
    "store_decode/preset=turboquant_4bit_nc/layout=soa/Hk=2/G=4/bs=16/lens=33+17/rotation=random/sinks=off/D=128/"
    "range=unit/act=float32/pattern=near-duplicate": ("nibbles-swapped", "norm-not-corrected"),
    "decode/preset=turboquant_k3v4_nc/layout=aos/Hk=2/G=4/bs=16/lens=24+9/rotation=random/sinks=on/D=128/range=unit/"
    "act=bfloat16/pattern=correlated": ("query-rotated-by-transpose", "wrong-kv-head"),
    "decode/preset=turboquant_4bit_nc/layout=soa/Hk=4/G=6/bs=16/lens=40+9/rotation=hadamard/sinks=off/D=128/"
    "range=unit/act=float16/pattern=dtype-edge": ("fp16-read-as-bf16", "norm-correction-twice"),
    "store_decode/preset=turboquant_k3v4_nc/layout=aos/Hk=2/G=4/bs=32/lens=20+5/rotation=random/sinks=on/D=128/"
    "range=unit/act=bfloat16/pattern=norm-edge": ("query-rotated-by-transpose", "last-token-skipped"),
    "decode/preset=turboquant_4bit_nc/layout=soa/Hk=2/G=8/bs=16/lens=24+7/rotation=hadamard/sinks=off/D=128/"
    "range=unit/act=bfloat16/pattern=aligned": ("last-token-skipped", "wrong-kv-head"),
    "store_decode/preset=turboquant_4bit_nc/layout=aos/Hk=2/G=4/bs=16/lens=17+3/rotation=random/sinks=on/D=96/"
    "range=unit/act=float16/pattern=aligned": ("last-token-skipped", "fp16-read-as-bf16"),
}


@pytest.mark.parametrize("short_id", sorted(CATCHES), ids=sorted(CATCHES))
def test_a_new_ci_cell_catches_its_planted_bugs(short_id):
    cells = {c.id: c for c in M.cells("ci")}
    cell = cells.get(f"turboquant/{short_id}/seed=0")
    assert cell is not None, f"turboquant/{short_id}/seed=0 is no longer a ci cell"
    base, memo = reference_impl("turboquant", "exact"), Memo()
    assert verdict_of(base, cell, "exact", memo).status == "pass"
    for name in CATCHES[short_id]:
        bug = PLANTED[f"turboquant.{name}"]
        assert bug.applies(cell), name
        assert verdict_of(bug.plant(base), cell, "exact", memo).status == "fail", name


def test_the_adversarial_decodes_keep_the_logit_error_in_the_first_order_regime_of_decode_exact():
    for cell in (c for c in M.adversarial("ci") if c.op != "store"):
        x = make_inputs(cell)
        cache = expected_cache(x) if cell.op == "store_decode" else x["kv_cache"]
        keys, values = dequantized(x, cache)
        _, _, xmax = attention_atol(rotated_query(x), keys, values, cell["G"], x["scale"], int(max(x["seq_lens"])))
        assert 8 * np.sqrt(2 * (cell["D"] + 1)) * U32 * xmax < 1e-3, cell.id
