"""The Triton TurboQuant kernels against the NumPy reference (interpreter on the CPU, native on a
GPU), in their fp32 ("exact") form: the store writes the reference's bytes; split-KV, pair-LUT and
unified decodes equal the reference decode to fp32 summation order; unified attention is causal
over prefill chunks."""
import numpy as np
import pytest
import torch

from conformance.families.turboquant.tolerances import decode_agreement
from conformance.testing import assert_close
from optimized.triton.tq_decode_grouped import decode_grouped
from optimized.triton.tq_decode_split import decode_split
from optimized.triton.tq_store import store
from optimized.triton.tq_unified import unified_attention

from tests.unit.tq_triton_helpers import DEVICE, R, make_case, t



def _agree(got, want, q, cache, bt, lens, preset, layout, rot):
    """The kernel's decode equals the reference's within the fp32 attention bound, doubled."""
    assert_close("out", got.cpu().numpy(), want, decode_agreement(q, cache, bt, lens, preset, layout, rot))


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("preset", list(R.PRESETS))
def test_store_writes_the_reference_bytes(preset, layout):
    rng = np.random.default_rng(1)
    p, D, Hk, bs, N = R.preset(preset), 64, 2, 16, 6
    rot = None if p.key_fp8 else R.random_rotation(D, 2)
    key = rng.standard_normal((N, Hk, D)).astype(np.float32) * 3
    value = rng.standard_normal((N, Hk, D)).astype(np.float32)
    value[0, 0, 5] = -70000.0  # beyond fp16: the zero point must be clamped, not -inf
    slots = rng.permutation(4 * bs)[:N].astype(np.int64)
    slots[2] = -1
    want = np.full((4, bs, Hk, p.slot_size(D)), 0x5A, np.uint8)
    R.store(want, key, value, slots, preset, layout, rot)
    got = t(np.full(want.shape, 0x5A, np.uint8))
    store(got, t(key), t(value), t(slots), preset=preset, layout=layout, rotation=t(rot))
    np.testing.assert_array_equal(got.cpu().numpy(), want)


CASES = [(p, lay) for p in R.PRESETS for lay in ("aos", "soa")]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("preset,layout", CASES)
def test_split_decode_equals_reference(preset, layout, splits):
    q, cache, bt, lens, rot, sk = make_case(preset, layout, sinks=splits == 3)
    want = R.decode(q, cache, bt, lens, preset, layout, rot, sinks=sk)
    got = decode_split(t(q), t(cache), t(bt), t(lens), preset=preset, layout=layout, rotation=t(rot),
                       sinks=t(sk), num_kv_splits=splits)
    _agree(got, want, q, cache, bt, lens, preset, layout, rot)


@pytest.mark.parametrize("keys", ["gather", "pair"])
@pytest.mark.parametrize("G,splits", [(1, 1), (6, 2)])
def test_grouped_decode_equals_reference(G, splits, keys):
    q, cache, bt, lens, rot, sk = make_case("turboquant_4bit_nc", "soa", G=G, lens=(70, 33, 1), sinks=splits > 1)
    want = R.decode(q, cache, bt, lens, "turboquant_4bit_nc", "soa", rot, sinks=sk)
    got = decode_grouped(t(q), t(cache), t(bt), t(lens), preset="turboquant_4bit_nc", layout="soa",
                          rotation=t(rot), sinks=t(sk), num_kv_splits=splits, keys=keys, block_n=16,
                          precision="exact")
    _agree(got, want, q, cache, bt, lens, "turboquant_4bit_nc", "soa", rot)


@pytest.mark.parametrize("bs,block_n", [(32, 16), (16, 32), (48, 64)])
def test_grouped_decode_tiles_nest_in_cache_blocks(bs, block_n):
    """Tiles inside one cache block (bs 32, tile 16: metadata rows from the middle of a block),
    tiles over whole blocks (bs 16, tile 32), and a block size that is no power of two (48: the
    launcher shrinks the tile to 16); three splits aligned to the tile, ragged lengths."""
    q, cache, bt, lens, rot, _ = make_case("turboquant_4bit_nc", "soa", G=2, bs=bs, lens=(97, 50, 17))
    want = R.decode(q, cache, bt, lens, "turboquant_4bit_nc", "soa", rot)
    got = decode_grouped(t(q), t(cache), t(bt), t(lens), preset="turboquant_4bit_nc", layout="soa",
                          rotation=t(rot), num_kv_splits=3, block_n=block_n, precision="exact")
    _agree(got, want, q, cache, bt, lens, "turboquant_4bit_nc", "soa", rot)


@pytest.mark.parametrize("preset", list(R.PRESETS))
def test_unified_decode_equals_reference(preset):
    q, cache, bt, lens, rot, sk = make_case(preset, "soa", G=4, sinks=True)
    want = R.decode(q, cache, bt, lens, preset, "soa", rot, sinks=sk)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32, device=DEVICE)
    got = unified_attention(t(q), t(cache), t(bt), qsl, t(lens), 1, preset=preset, rotation=t(rot), sinks=t(sk),
                            precision="exact")
    _agree(got, want, q, cache, bt, lens, preset, "soa", rot)


def test_unified_prefill_is_causal_per_token_decode():
    """Query row i of a q_len-token chunk sees exactly the first seq_len - q_len + i + 1 keys."""
    preset = "turboquant_k3v4_nc"
    q, cache, bt, lens, rot, _ = make_case(preset, "soa", G=2, lens=(9, 40))
    q_lens = [3, 20]
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((sum(q_lens), q.shape[1], q.shape[2])).astype(np.float32)
    want, row = [], 0
    for b, (L, ql) in enumerate(zip(lens, q_lens)):
        for i in range(ql):
            want.append(R.decode(Q[row:row + 1], cache, bt[b:b + 1], np.array([L - ql + i + 1], np.int32),
                                 preset, "soa", rot)[0])
            row += 1
    qsl = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=DEVICE)
    got = unified_attention(t(Q), t(cache), t(bt), qsl, t(lens), max(q_lens), preset=preset, rotation=t(rot),
                            precision="exact")
    bound = decode_agreement(Q, cache, np.repeat(bt, q_lens, axis=0),
                             np.concatenate([np.arange(L - ql + 1, L + 1) for L, ql in zip(lens, q_lens)]),
                             preset, "soa", rot)
    assert_close("out", got.cpu().numpy(), np.stack(want), bound)


@pytest.mark.parametrize("mma", ["ieee", "bf16", "fp16"])
def test_pair_table_entry_packs_both_centroids_of_a_byte(mma):
    """Entry b of the pair table holds c[b & 15] in its low half and c[b >> 4] in its high half
    (fp32 pairs in int64; bf16 or fp16 pairs in int32, the 16-bit paths the interpreter cannot run)."""
    import ml_dtypes

    from optimized.triton.tq_decode_launch import pair_table
    from reference.turboquant.lloyd_max import centroids

    table = pair_table(R.preset("turboquant_4bit_nc"), 128, torch.device("cpu"), mma).numpy()
    c, b = centroids(4, 128), np.arange(256)
    half = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}.get(mma)
    if half is not None:
        halves = table.view(np.uint16).reshape(256, 2).view(half).astype(np.float32)
        c = c.astype(half).astype(np.float32)
    else:
        halves = table.view(np.float32).reshape(256, 2)
    assert table.dtype == (np.int64 if half is None else np.int32)
    np.testing.assert_array_equal(halves, np.stack([c[b & 15], c[b >> 4]], axis=1))
