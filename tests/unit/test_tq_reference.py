"""TurboQuant references: sizes, centroids, rotations, packing, byte layouts, store/dequantize
exactness, layout round trips, split-KV, NumPy vs JAX agreement, and bad-input errors."""
import ml_dtypes
import numpy as np
import pytest
from scipy import integrate, stats

from conformance.families import turboquant as fam
from conformance.families.turboquant.matrix import decode_cell
from conformance.families.turboquant.tolerances import decode_agreement
from conformance.testing import assert_close
from reference.turboquant import jax_ref, lloyd_max, numpy_ref
from reference.turboquant import layout as tq_layout
from reference.turboquant.presets import PRESETS, preset


def test_preset_sizes_match_the_upstream_table_at_d128():
    got = {n: (p.key_packed_size(128), p.value_packed_size(128), p.slot_size(128)) for n, p in PRESETS.items()}
    assert got == {"turboquant_k8v4": (128, 68, 196), "turboquant_4bit_nc": (66, 68, 134),
                   "turboquant_k3v4_nc": (50, 68, 118), "turboquant_3bit_nc": (50, 52, 102)}
    assert preset("turboquant_4bit_nc").slot_size(64) == 70


def test_lloyd_max_distortion_matches_the_paper_and_scipy():
    for bits, paper in ((1, 0.363), (2, 0.1175), (3, 0.0345), (4, 0.0095)):
        assert lloyd_max.gaussian_mse(bits, 128) == pytest.approx(paper, rel=0.02)
    c = lloyd_max.centroids(4, 128).astype(np.float64)
    sigma = 1 / np.sqrt(128)
    assert np.all(np.diff(c) > 0) and np.allclose(c, -c[::-1], atol=1e-7)
    edges = np.concatenate([[-10.5 * sigma], (c[:-1] + c[1:]) / 2, [10.5 * sigma]])
    for i in range(len(c)):  # each centroid is the conditional mean of its cell (scipy quadrature)
        mass = integrate.quad(stats.norm(0, sigma).pdf, edges[i], edges[i + 1])[0]
        first = integrate.quad(lambda x: x * stats.norm(0, sigma).pdf(x), edges[i], edges[i + 1])[0]
        assert abs(first / mass - c[i]) < 1e-3 * sigma


def test_rotations_are_orthogonal_and_only_hadamard_is_symmetric():
    h, r = numpy_ref.hadamard(128), numpy_ref.random_rotation(128, 7)
    for m in (h, r):
        assert np.abs(m @ m.T - np.eye(128)).max() < 1e-5
    assert np.array_equal(h, h.T) and np.abs(r - r.T).max() > 0.1
    assert np.allclose(np.asarray(jax_ref.hadamard(128)), h, atol=1e-7)
    with pytest.raises(ValueError, match="power of two"):
        numpy_ref.hadamard(96)


@pytest.mark.parametrize("bits", [3, 4])
def test_packing_round_trips_and_puts_the_even_element_low(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, (5, 128)).astype(np.uint8)
    packed = numpy_ref.pack_codes(codes, bits)
    assert packed.shape == (5, 128 * bits // 8)
    assert np.array_equal(numpy_ref.unpack_codes(packed, bits, 128), codes)
    assert np.array_equal(np.asarray(jax_ref.pack_codes(codes, bits)), packed)
    if bits == 4:
        assert numpy_ref.pack_codes(np.array([1, 2], np.uint8), 4)[0] == 0x21
    else:
        assert list(numpy_ref.pack_codes(np.array([1, 2, 3, 4, 5, 6, 7, 0], np.uint8), 3)) == [0xD1, 0x58, 0x1F]


def test_soa_offsets_match_the_worked_example():
    p = preset("turboquant_4bit_nc")  # D=128, Hk=8, BS=16: the worked example of the SoA offsets
    offs = tq_layout.field_offsets(p, 128, 8, 16, "soa", np.array([5]), np.array([3]))
    assert offs["key_data"][0] == 5 * 1024 + 3 * 128 and offs["value_data"][0] == 5 * 1024 + 3 * 128 + 64
    assert offs["k_norm"][0] == 16384 + 2 * (48 * 3 + 5)
    assert offs["v_scale"][0] == 16384 + 2 * (48 * 3 + 16 + 5) and offs["v_zero"][0] == 16384 + 2 * (48 * 3 + 32 + 5)
    assert tq_layout.block_bytes(p, 128, 8, 16) == 17152
    aos = tq_layout.field_offsets(p, 128, 8, 16, "aos", np.array([1]), np.array([2]))
    assert (aos["key_data"][0], aos["k_norm"][0], aos["value_data"][0], aos["v_scale"][0], aos["v_zero"][0]) == \
        (10 * 134, 10 * 134 + 64, 10 * 134 + 66, 10 * 134 + 130, 10 * 134 + 132)


def _stored(name, layout, N=40, Hk=2, D=128, bs=16, seed=0):
    rng = np.random.default_rng(seed)
    p = preset(name)
    cache = np.full((6, bs, Hk, p.slot_size(D)), 0x5A, np.uint8)
    key = rng.standard_normal((N, Hk, D)).astype(np.float32)
    value = rng.standard_normal((N, Hk, D)).astype(np.float32)
    slots = rng.permutation(6 * bs)[:N]
    slots[::7] = -1
    R = numpy_ref.random_rotation(D, seed)
    numpy_ref.store(cache, key, value, slots, name, layout, R)
    return cache, key, value, slots, R


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_store_then_dequantize_gives_centroids_times_the_stored_norm(name, layout):
    cache, key, value, slots, R = _stored(name, layout)
    p, kept = preset(name), slots[slots >= 0]
    f = numpy_ref.read_fields(cache, kept, p, layout, 128)
    bt = np.arange(6, dtype=np.int32)[None, :]
    keys, values = numpy_ref.dequantize(cache, bt, [6 * 16], name, layout, R, rotated=True)
    k, v = keys[0][kept], values[0][kept]
    if p.key_fp8:
        assert np.array_equal(k, key[slots >= 0].astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    else:
        c = lloyd_max.centroids(p.key_bits, 128)[f["key_codes"]]
        if p.norm_correction and layout == "aos":
            c = c / np.sqrt(np.sum(c * c, axis=-1, keepdims=True) + np.float32(1e-16))
        assert np.array_equal(k, f["k_norm"].astype(np.float32)[..., None] * c)
        y = (key[slots >= 0] / np.linalg.norm(key[slots >= 0], axis=-1, keepdims=True)) @ R
        assert np.mean(np.abs(k / np.linalg.norm(k, axis=-1, keepdims=True) - y)) < 0.1 / np.sqrt(128) * 2
    assert np.array_equal(v, f["value_codes"] * f["v_scale"].astype(np.float32)[..., None]
                          + f["v_zero"].astype(np.float32)[..., None])
    assert np.all(np.abs(v - value[slots >= 0]) <= f["v_scale"].astype(np.float32)[..., None] * 0.51 + 1e-2)
    untouched = np.ones(6 * 16, bool)
    untouched[kept] = False
    if layout == "aos":
        assert np.all(cache.reshape(-1, 2, cache.shape[-1])[untouched] == 0x5A)  # skipped slots untouched


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_aos_soa_round_trip_is_byte_identical(name):
    cache, *_ = _stored(name, "aos")
    soa = numpy_ref.convert_layout(cache, "aos", "soa", name)
    assert not np.array_equal(soa, cache)
    assert np.array_equal(numpy_ref.convert_layout(soa, "soa", "aos", name), cache)
    assert np.array_equal(np.asarray(jax_ref.convert_layout(cache, "aos", "soa", name)), soa)
    direct, *_ = _stored(name, "soa")
    if preset(name).key_fp8 or not preset(name).norm_correction:
        assert np.array_equal(soa, direct)  # no pre-folded scalar: the layouts hold the same fields


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_split_kv_equals_unsplit(impl):
    cell = decode_cell("decode", "turboquant_k3v4_nc", "soa", (4, 6), 16, (33, 1, 20), "random", True)
    x = fam.make_inputs(cell)
    args = (x["query"], x["kv_cache"], x["block_table"], x["seq_lens"], x["preset"], x["layout"], x["rotation"])
    ref = np.asarray(impl.decode(*args, scale=x["scale"], sinks=x["sinks"]))
    for splits in (2, 5, 40):  # 40 > every length: empty splits
        got = np.asarray(impl.decode(*args, scale=x["scale"], sinks=x["sinks"], num_kv_splits=splits))
        assert_close("out", got, ref, decode_agreement(*args, scale=x["scale"]))


def test_numpy_and_jax_agree_on_every_ci_decode_cell_and_quantization_error_is_within_bound():
    for cell in fam.cells("ci"):
        if cell.op != "decode":
            continue
        x = fam.make_inputs(cell)
        outs = [np.asarray(fam.run_with(impl, cell, dict(x))["out"]) for impl in (numpy_ref, jax_ref)]
        assert_close(f"out {cell.id}", outs[1], outs[0], decode_agreement(
            x["query"], x["kv_cache"], x["block_table"], x["seq_lens"], x["preset"], x["layout"], x["rotation"],
            x["scale"]))
        verdict = fam.check(cell, "exact", x, {"out": outs[0]})
        assert verdict.status == "pass" and verdict.quality["quant_within_bound"], cell.id


@pytest.mark.parametrize("impl", [numpy_ref, jax_ref], ids=["numpy", "jax"])
def test_bad_input_raises_value_error_naming_the_argument(impl):
    name = "turboquant_4bit_nc"
    cache, key, value, slots, R = _stored(name, "aos")
    bt, lens = np.array([[0, 1, 2]], np.int32), np.array([40], np.int32)
    q = np.zeros((1, 4, 128), np.float32)
    cases = {
        "D": lambda: impl.store(cache, key[..., :72], value[..., :72], slots, name, "aos", R),
        "kv_cache": lambda: impl.store(np.ascontiguousarray(cache[..., :-2]), key, value, slots, name, "aos", R),
        "kv_cache must be uint8": lambda: impl.store(cache.astype(np.int16), key, value, slots, name, "aos", R),
        "slot_mapping": lambda: impl.store(cache, key, value, slots + 10**6, name, "aos", R),
        "preset": lambda: impl.store(cache, key, value, slots, "turboquant_2bit", "aos", R),
        "layout": lambda: impl.store(cache, key, value, slots, name, "soa2", R),
        "block_table": lambda: impl.decode(q, cache, bt + 99, lens, name, "aos", R),
        "seq_lens": lambda: impl.decode(q, cache, bt, lens * 0, name, "aos", R),
        "rotation": lambda: impl.decode(q, cache, bt, lens, name, "aos", R[:64]),
        "query": lambda: impl.decode(q[0], cache, bt, lens, name, "aos", R),
    }
    for what, call in cases.items():
        with pytest.raises(ValueError, match=what.split()[0]):
            call()
