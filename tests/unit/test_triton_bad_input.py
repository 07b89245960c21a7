"""Every Triton TurboQuant launcher refuses bad input before launching, with an error naming the
argument: cache size vs preset/layout/head size, non-integer group ratio, unsupported head size, wrong
dtypes, wrong kernel/preset pairing, launch options. The family's refusals (NaN, block ids, seq_lens,
slots, scale: ``conformance.families.turboquant.REFUSALS``) run on every launcher in tests/unit/test_refusals.py."""
import numpy as np
import pytest
import torch

from optimized.triton.tq_decode_grouped import decode_grouped
from optimized.triton.tq_decode_launch import DecodeWorkspace
from optimized.triton.tq_decode_split import decode_split
from optimized.triton.tq_store import store
from optimized.triton.tq_unified import unified_attention

from tests.unit.tq_triton_helpers import DEVICE, R, make_case, t

P = "turboquant_4bit_nc"


@pytest.fixture(scope="module")
def case():
    q, cache, bt, lens, rot, _ = make_case(P, "soa", G=2, lens=(5, 20))
    return dict(q=t(q), cache=t(cache), bt=t(bt), lens=t(lens), rot=t(rot))


def _decode(c, **over):
    a = dict(query=c["q"], kv_cache=c["cache"], block_table=c["bt"], seq_lens=c["lens"])
    kw = dict(preset=P, layout="soa", rotation=c["rot"])
    for k, v in over.items():
        (a if k in a else kw)[k] = v
    return decode_split(a["query"], a["kv_cache"], a["block_table"], a["seq_lens"], **kw)


@pytest.mark.parametrize("change,match", [
    (dict(preset="turboquant_k3v4_nc"), "kv_cache must have shape"),       # slot size of another preset
    (dict(layout="diagonal"), "layout"),
    (dict(seq_lens=torch.tensor([5, 20], dtype=torch.int64)), "seq_lens"),
    (dict(block_table="int64"), "block_table"),
    (dict(query="heads5"), "multiple of the cache's kv heads"),
    (dict(query="d32"), "head size"),
    (dict(rotation=None), "rotation"),
    (dict(sinks=torch.zeros(3)), "sinks"),
])
def test_decode_rejects_bad_input(case, change, match):
    over = {}
    for k, v in change.items():
        if k == "block_table":
            over[k] = case["bt"].long()
        elif k == "query":
            q = case["q"].clone()
            if v == "heads5":
                q = q[:, :3].contiguous()
            else:
                q = q[:, :, :32].contiguous()
            over[k] = q
        elif isinstance(v, torch.Tensor):
            over[k] = v.to(DEVICE)
        else:
            over[k] = v
    with pytest.raises((ValueError, TypeError), match=match):
        _decode(case, **over)


def test_unused_block_table_columns_may_hold_anything(case):
    bt = case["bt"].clone()
    bt[0, -1] = -7  # sequence 0 (5 tokens) uses column 0 only
    _decode(case, block_table=bt)


def test_workspace_too_small_is_refused(case):
    ws = DecodeWorkspace(1, case["q"].shape[1], case["q"].shape[2], device=DEVICE)
    with pytest.raises(ValueError, match="workspace"):
        _decode(case, workspace=ws)


def test_grouped_decode_refuses_other_presets_and_layouts(case):
    with pytest.raises(ValueError, match="preset/layout"):
        decode_grouped(case["q"], case["cache"], case["bt"], case["lens"], preset=P, layout="aos",
                        rotation=case["rot"])


@pytest.mark.parametrize("change,match", [
    (dict(block_n=48), "block_n"),
    (dict(block_n=8), "block_n"),
    (dict(keys="select"), "keys"),
    (dict(precision="fp8"), "precision"),
])
def test_grouped_decode_refuses_bad_options(case, change, match):
    with pytest.raises(ValueError, match=match):
        decode_grouped(case["q"], case["cache"], case["bt"], case["lens"], preset=P, layout="soa",
                        rotation=case["rot"], **change)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter refuses 16-bit MMA operands")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_mma_operands_are_refused_in_the_interpreter_naming_precision(case, dtype):
    """precision "act" (MMA operands in the query's dtype) cannot run under TRITON_INTERPRET=1, whose
    16-bit arithmetic is broken: refused for 16-bit queries, never run as fp32 or bf16 instead."""
    q = case["q"].to(dtype)
    with pytest.raises(ValueError, match=r"^precision 'act' with a torch\.(bfloat16|float16) query"):
        decode_grouped(q, case["cache"], case["bt"], case["lens"], preset=P, layout="soa", rotation=case["rot"],
                       precision="act")
    with pytest.raises(ValueError, match=r"^precision 'act'"):
        unified_attention(q, case["cache"], case["bt"], torch.arange(q.shape[0] + 1, dtype=torch.int32, device=DEVICE),
                          case["lens"], 1, preset=P, rotation=case["rot"], precision="act")


def test_grouped_decode_refuses_block_sizes_its_tiles_cannot_nest_in():
    """A tile must lie inside one cache block or cover whole blocks: block size 24 (neither a
    power of two nor a multiple of 16) is refused, naming kv_cache."""
    q, cache, bt, lens, rot, _ = make_case(P, "soa", G=2, bs=24, lens=(5, 30))
    with pytest.raises(ValueError, match="kv_cache block size"):
        decode_grouped(t(q), t(cache), t(bt), t(lens), preset=P, layout="soa", rotation=t(rot))


def test_grouped_decode_refuses_a_cache_not_on_a_word_boundary(case):
    """The grouped decode loads codes as 32-bit words: a cache view starting 2 bytes into its
    storage (valid for the other kernels: even, for the fp16 metadata) is refused, naming kv_cache."""
    cache = case["cache"]
    storage = torch.zeros(cache.numel() + 2, dtype=torch.uint8, device=cache.device)
    shifted = storage[2:].view(cache.shape)
    shifted.copy_(cache)
    with pytest.raises(ValueError, match="kv_cache: decode_grouped loads the codes as 32-bit words"):
        decode_grouped(case["q"], shifted, case["bt"], case["lens"], preset=P, layout="soa", rotation=case["rot"])


def test_unified_refuses_bad_query_start_loc(case):
    qsl = torch.tensor([0, 2, 2], dtype=torch.int32, device=DEVICE)  # second sequence has no token
    q = case["q"][:2].contiguous()
    with pytest.raises(ValueError, match="query_start_loc"):
        unified_attention(q, case["cache"], case["bt"], qsl, case["lens"], 2, preset=P, rotation=case["rot"])


def _store_args(N=4, Hk=2, D=64, bs=16, nb=3, preset=P, layout="aos"):
    rng = np.random.default_rng(0)
    p = R.preset(preset)
    cache = t(np.zeros((nb, bs, Hk, p.slot_size(D)), np.uint8))
    kv = t(rng.standard_normal((N, Hk, D)).astype(np.float32))
    return cache, kv, kv.clone(), t(np.arange(N, dtype=np.int64)), t(R.hadamard(D))


@pytest.mark.parametrize("what,match", [
    ("slot_out_of_range", "slot_mapping"),
    ("slot_repeated", "repeated"),
    ("value_shape", "value"),
    ("nan_key", "key"),
    ("zero_tokens", "N"),
    ("cache_dtype", "kv_cache"),
])
def test_store_rejects_bad_input(what, match):
    cache, key, value, slots, rot = _store_args()
    if what == "slot_out_of_range":
        slots[1] = cache.shape[0] * cache.shape[1]
    elif what == "slot_repeated":
        slots[2] = slots[1]
    elif what == "value_shape":
        value = value[:, :1].contiguous()
    elif what == "nan_key":
        key[0, 0, 0] = float("nan")
    elif what == "zero_tokens":
        key, value, slots = key[:0], value[:0], slots[:0]
    else:
        cache = cache.to(torch.int16)
    with pytest.raises((ValueError, TypeError), match=match):
        store(cache, key, value, slots, preset=P, layout="aos", rotation=rot)


def _expanded_out(B, Hq, D, guard=256):
    """An ``out [B, Hq, D]`` whose last dimension is a broadcast (stride 0) of a ``[B, Hq]`` region at
    the start of a buffer of sentinels, and that buffer: a kernel that assumes stride 1 writes
    ``D - 1`` elements past the region."""
    buf = torch.full((B * Hq + guard,), 7.0, device=DEVICE)
    return buf[: B * Hq].view(B, Hq, 1).expand(B, Hq, D), buf


@pytest.mark.parametrize("launcher", ["split", "grouped", "unified"])
def test_an_output_that_overlaps_itself_is_refused_and_nothing_is_written(case, launcher):
    """Before the output checks, unified attention wrote 63 elements past an out of strides
    (Hq, 1, 0) (its kernel assumed a last stride of 1); every decode now refuses it, naming out."""
    B, Hq, D = case["q"].shape
    out, buf = _expanded_out(B, Hq, D)
    kw = dict(preset=P, layout="soa", rotation=case["rot"], out=out)
    with pytest.raises(ValueError, match="^out "):
        if launcher == "unified":
            qsl = torch.arange(B + 1, dtype=torch.int32, device=DEVICE)
            unified_attention(case["q"], case["cache"], case["bt"], qsl, case["lens"], 1, **kw)
        else:
            (decode_split if launcher == "split" else decode_grouped)(
                case["q"], case["cache"], case["bt"], case["lens"], **kw)
    assert bool((buf == 7.0).all())


@pytest.mark.parametrize("strides,match", [
    (lambda B, Hq, D: (Hq * D, 0, 1), "overlaps itself"),          # every head writes one row
    (lambda B, Hq, D: (D, D, 1), "overlaps itself"),               # sequence b + 1 starts at head 1 of b
    (lambda B, Hq, D: (Hq * 2 * D, 2 * D, 2), "rows must be contiguous"),
])
def test_outputs_with_bad_strides_are_refused(case, strides, match):
    B, Hq, D = case["q"].shape
    buf = torch.zeros(4 * B * Hq * D, device=DEVICE)
    out = buf.as_strided((B, Hq, D), strides(B, Hq, D))
    with pytest.raises(ValueError, match=f"^out .*{match}"):
        _decode(case, out=out)


@pytest.mark.parametrize("args,name", [
    ((0, 4, 64), "max_batch"), ((2, 0, 64), "num_q_heads"), ((2, 4, 64.0), "head_size"),
    ((2, 4, 64, 65), "max_splits"), ((2, 4, 64, 0), "max_splits"),
])
def test_workspace_sizes_outside_their_range_name_themselves(args, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        DecodeWorkspace(*args, device=DEVICE)


@pytest.mark.parametrize("splits", [0, 65, 1.5, True])
def test_split_counts_outside_their_range_name_themselves(case, splits):
    with pytest.raises(ValueError, match="^num_kv_splits must be"):
        _decode(case, num_kv_splits=splits)


def test_a_strided_slot_mapping_is_refused_and_nothing_is_written_past_the_cache():
    """Before the contiguity check, the store validated slot_mapping through its strides but its
    kernel read ``ptr + n``: a view [0, 1] of [0, past, 1, past] wrote 69 bytes past the cache."""
    cache, key, value, _, rot = _store_args(N=2, nb=2)
    n = cache.numel()
    buf = torch.full((n + 4096,), 0xA5, dtype=torch.uint8, device=DEVICE)
    view = buf[:n].view(cache.shape)
    past = cache.shape[0] * cache.shape[1] + 3
    slots = torch.tensor([0, past, 1, past], dtype=torch.int64, device=DEVICE)[::2]
    with pytest.raises(ValueError, match="^slot_mapping must be contiguous"):
        store(view, key[:2], value[:2], slots, preset=P, layout="aos", rotation=rot)
    assert bool((buf == 0xA5).all())


@pytest.mark.parametrize("name", ["seq_lens", "rotation", "sinks"])
def test_tensors_read_as_flat_memory_must_be_contiguous(case, name):
    q = case["q"]
    values = {"seq_lens": case["lens"], "rotation": case["rot"], "sinks": torch.zeros(q.shape[1], device=DEVICE)}
    x = values[name]
    strided = torch.stack([x, x], dim=-1).select(-1, 0)  # same values, last stride 2
    with pytest.raises(ValueError, match=f"^{name} must be contiguous"):
        _decode(case, **{name: strided})


def test_a_rotation_with_nan_is_refused_also_after_a_good_call_with_it(case):
    rot = case["rot"].clone()
    _decode(case, rotation=rot)  # finite: checked once, then remembered for this tensor and version
    rot[3, 5] = float("nan")  # an in-place write moves the version counter: checked again
    with pytest.raises(ValueError, match="rotation holds NaN or Inf"):
        _decode(case, rotation=rot)
    with pytest.raises(ValueError, match="rotation holds NaN or Inf"):
        _decode(case, rotation=rot.clone())  # another tensor


def test_a_rotation_written_through_a_numpy_view_is_checked_again(case):
    rot = case["rot"].clone()
    _decode(case, rotation=rot)
    if rot.device.type != "cpu":
        pytest.skip("a NumPy view exists of CPU memory only")
    version = rot._version
    rot.numpy()[3, 5] = np.nan   # torch's version counter does not see this write
    assert rot._version == version
    with pytest.raises(ValueError, match="rotation holds NaN or Inf"):
        _decode(case, rotation=rot)
