"""The streaming floor of two access structures over the SoA 4bit_nc cache of the decode, no
arithmetic: per-head, one program per (sequence, kv head, split) reads its head's 128-byte
records (what the grouped decode does); all-heads, one program per (sequence, split) reads every
head of each token (the whole 16-token block, 16 KiB contiguous). Writes
``tq_decode_floor_standalone.json``: ``python -m bench.probes.decode_floor_standalone
--out DIR`` (on a GPU)."""
import sys

import torch
import triton
import triton.language as tl

from optimized.triton.tq_common import split_range


@triton.jit
def _per_head(cache_ptr, bt_ptr, lens_ptr, out_ptr, stride_blk, stride_bt, HK: tl.constexpr, BS: tl.constexpr,
              S: tl.constexpr, BLOCK_N: tl.constexpr, REC: tl.constexpr):
    b = tl.program_id(0); h = tl.program_id(1); s = tl.program_id(2)
    start, end = split_range(lens_ptr, b, s, S, BLOCK_N)
    w = tl.arange(0, REC // 4)
    acc = tl.zeros((BLOCK_N, REC // 4), tl.int32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        live = t < end
        blk = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + t // BS, mask=live, other=0)
        rec = cache_ptr + blk.to(tl.int64) * stride_blk + ((t % BS) * HK + h) * REC
        acc ^= tl.load(rec.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=live[:, None], other=0)
    tl.store(out_ptr + (b * HK + h) * S + s, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def _all_heads(cache_ptr, bt_ptr, lens_ptr, out_ptr, stride_blk, stride_bt, HK: tl.constexpr, BS: tl.constexpr,
               S: tl.constexpr, BLOCK_N: tl.constexpr, REC: tl.constexpr):
    b = tl.program_id(0); s = tl.program_id(1)
    start, end = split_range(lens_ptr, b, s, S, BLOCK_N)
    w = tl.arange(0, HK * REC // 4)
    acc = tl.zeros((BLOCK_N, HK * REC // 4), tl.int32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        live = t < end
        blk = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + t // BS, mask=live, other=0)
        rec = cache_ptr + blk.to(tl.int64) * stride_blk + (t % BS) * HK * REC
        acc ^= tl.load(rec.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=live[:, None], other=0)
    tl.store(out_ptr + b * S + s, tl.sum(tl.sum(acc, 1), 0))


def main(argv=None) -> int:
    from conformance.families.turboquant import cost
    from bench.turboquant_gpu import decode_inputs
    from bench.probes.common import graph_ms, impl_ms, out_dir, shape, write_json

    out_path = out_dir(__doc__.splitlines()[0], argv) / "tq_decode_floor_standalone.json"
    s = shape(8192)
    B, Hk = s["B"], s["Hk"]
    case = decode_inputs(s)
    cache, bt, lens = case["cache"], case["block_table"], case["seq_lens"]
    tq_bytes = cost.decode(s).bytes
    copy_ms = impl_ms("gpu-copy", s, case)
    copy = 2 * tq_bytes / (copy_ms * 1e-3)       # read + write
    sdpa = impl_ms("torch-sdpa", s, case)
    out = torch.empty(B * Hk * 64, dtype=torch.int32, device="cuda")
    res = {"copy_TBps": copy / 1e12, "sdpa_ms": sdpa}
    print(f"copy {copy / 1e12:.2f} TB/s sdpa {sdpa:.4f} ms")
    runs = []
    for S in (4, 16):
        for N in (32, 64):
            runs.append((f"per-head S={S} N={N}", lambda S=S, N=N: _per_head[(B, Hk, S)](
                cache, bt, lens, out, cache.stride(0), bt.stride(0), HK=Hk, BS=16, S=S, BLOCK_N=N, REC=128, num_warps=4)))
    for S in (8, 32):
        for N in (16, 32):
            for nw in (4, 8):
                runs.append((f"all-heads S={S} N={N} w={nw}", lambda S=S, N=N, nw=nw: _all_heads[(B, S)](
                    cache, bt, lens, out, cache.stride(0), bt.stride(0), HK=Hk, BS=16, S=S, BLOCK_N=N, REC=128, num_warps=nw)))
    for name, fn in runs:
        try:
            ms = graph_ms(fn)
        except Exception as e:  # a variant that fails to compile is reported, not fatal
            print(name, "ERROR", str(e)[:150])
            continue
        res[name] = ms
        print(f"{name:28s} {ms:.4f} ms x sdpa {ms / sdpa:.3f} %copy {100 * tq_bytes / (ms * 1e-3) / copy:.1f}")
    write_json(out_path, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
