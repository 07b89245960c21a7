"""The script behind ``tq_decode_floor_standalone.json`` (H200, third session): the streaming floor of
two access structures over the same SoA 4bit_nc cache, no arithmetic.
per-head: one program per (sequence, kv head, split) reads its head's 128-byte records (what the
grouped decode does); all-heads: one program per (sequence, split) reads every head of each token
(the whole 16-token block, 16 KiB contiguous). Run from the repository root on a GPU:
``PYTHONPATH=. OUT=DIR python3 reports/baselines/h200/scripts/decode_floor_standalone.py``."""
import json
import os

import torch
import triton
import triton.language as tl

from optimized.triton import bench
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


def main():
    B, Hk, G, D, L = 32, 8, 8, 128, 8192
    copy = bench.copy_bandwidth()
    case = bench.build_case(B, Hk, G, D, L)
    sdpa = bench.time_sdpa(B, Hk, G, D, L)
    cache, bt, lens = case["cache"], case["block_table"], case["seq_lens"]
    tq_bytes = B * L * Hk * 134
    out = torch.empty(B * Hk * 64, dtype=torch.int32, device="cuda")
    res = {"copy_TBps": copy / 1e12, "sdpa_ms": sdpa}
    print(f"copy {copy/1e12:.2f} TB/s sdpa {sdpa:.4f} ms gate {0.35*sdpa:.4f} ms")
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
            ms = bench.graph_ms(fn)
        except Exception as e:
            print(name, "ERROR", str(e)[:150]); continue
        res[name] = ms
        print(f"{name:28s} {ms:.4f} ms x sdpa {ms/sdpa:.3f} %copy {100*tq_bytes/(ms*1e-3)/copy:.1f}")
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "tq_floor2.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
