"""GPU timing of the TurboQuant Triton decode against torch SDPA on a bf16 cache and a
device-to-device copy, all measured in the same process (`python3 -m optimized.triton.bench`).

Shape of the issue: B=32, Hk=8, G=8, D=128, turboquant_4bit_nc, SoA, block size 16, sequence
lengths 8192 and 32768 (every sequence full length), block table a random permutation.
Byte model: the compressed cache is read once per kv head, ``B * L * Hk * slot_size`` bytes
(134 per token and head), plus the query and output (negligible). bf16-equivalent bytes:
``B * L * Hk * D * 2 * 2`` (K and V), what SDPA streams. Copy bandwidth counts read + write.
Timing: CUDA-graph replays (``graph_ms``) timed by ``triton.testing.do_bench`` medians (device
events), for the TQ decodes and SDPA alike; warm-up first; the caches are
gigabytes, far beyond the 60 MB L2, so nothing is served from cache between repetitions.
"""
from __future__ import annotations

import argparse
import json
import sys

PRESET = "turboquant_4bit_nc"


def _median_ms(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))


def graph_ms(fn) -> float:
    """Median ms of replaying ``fn`` captured in a CUDA graph (how a server runs a decode step:
    no launch or host overhead; argument value checks run once, in the eager warm-up call)."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return _median_ms(graph.replay)


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write)."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 256)
    ms = _median_ms(lambda: b.copy_(a))
    return 2 * nbytes / (ms * 1e-3)


def build_case(B: int, Hk: int, G: int, D: int, L: int, block_size: int = 16, seed: int = 0):
    """A full SoA 4bit_nc cache of B sequences of L tokens written by the store kernel."""
    import torch

    from reference.turboquant.presets import preset
    from reference.turboquant.rotation import hadamard
    from optimized.triton.tq_store import store

    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = preset(PRESET)
    nblocks = B * L // block_size
    cache = torch.empty(nblocks, block_size, Hk, p.slot_size(D), dtype=torch.uint8, device="cuda")
    rot = torch.from_numpy(hadamard(D)).cuda()
    slots_all = torch.arange(nblocks * block_size, device="cuda")
    chunk = 1 << 19
    for s0 in range(0, nblocks * block_size, chunk):
        n = min(chunk, nblocks * block_size - s0)
        k = torch.randn(n, Hk, D, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, Hk, D, generator=gen, device="cuda", dtype=torch.bfloat16)
        store(cache, k, v, slots_all[s0:s0 + n], preset=PRESET, layout="soa", rotation=rot)
    perm = torch.randperm(nblocks, generator=gen, device="cuda").to(torch.int32)
    block_table = perm.view(B, L // block_size).contiguous()
    seq_lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    query = torch.randn(B, Hk * G, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    return dict(cache=cache, block_table=block_table, seq_lens=seq_lens, query=query, rotation=rot)


def time_sdpa(B: int, Hk: int, G: int, D: int, L: int) -> float:
    """Median ms of torch SDPA decode (one query token) on a contiguous bf16 cache."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(B, Hk * G, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
    ms = graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    del k, v
    return ms


def variants(quick: bool = False):
    """(name, launcher, keyword arguments) of the decodes timed; ``quick``: the grouped-decode
    sweep alone (no split-KV or unified decode)."""
    from optimized.triton.tq_decode_grouped import decode_grouped
    from optimized.triton.tq_decode_split import decode_split

    out = [] if quick else [("split-exact", decode_split, {})]
    out.append(("grouped default", decode_grouped, {}))
    out.append(("grouped keys=pair", decode_grouped, dict(keys="pair")))
    for keys in ("gather", "pair"):
        out.append((f"grouped keys={keys} N=64", decode_grouped, dict(keys=keys, block_n=64)))
    out.append(("grouped w=8", decode_grouped, dict(num_warps=8)))
    for S in (2, 8):
        out.append((f"grouped S={S}", decode_grouped, dict(num_kv_splits=S)))
    return out


def run(lengths=(8192, 32768), B=32, Hk=8, G=8, D=128, quick=False) -> dict:
    import torch

    from reference.turboquant.presets import preset
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_grouped import decode_grouped
    from optimized.triton.tq_unified import unified_attention

    slot = preset(PRESET).slot_size(D)
    res = {"device": torch.cuda.get_device_name(), "shape": dict(B=B, Hk=Hk, G=G, D=D, preset=PRESET,
                                                                 layout="soa", block_size=16)}
    res["copy_Bps"] = copy_bandwidth()
    res["cases"] = []
    for L in lengths:
        case = build_case(B, Hk, G, D, L)
        tq_bytes = B * L * Hk * slot
        bf16_bytes = B * L * Hk * D * 2 * 2
        sdpa_ms = time_sdpa(B, Hk, G, D, L)
        ws = DecodeWorkspace(B, Hk * G, D, max_splits=32)
        out = torch.empty(B, Hk * G, D, dtype=torch.bfloat16, device="cuda")
        row = {"L": L, "sdpa_ms": sdpa_ms, "sdpa_Bps": bf16_bytes / (sdpa_ms * 1e-3), "tq_bytes": tq_bytes,
               "bf16_bytes": bf16_bytes, "kernels": {}}
        args = (case["query"], case["cache"], case["block_table"], case["seq_lens"])
        common = dict(preset=PRESET, layout="soa", rotation=case["rotation"], workspace=ws, out=out)
        exact = decode_grouped(*args, **{**common, "out": None}, precision="exact").float()
        for name, fn, kw in variants(quick):
            try:
                ms = graph_ms(lambda: fn(*args, **common, **kw))
                err = float((out.float() - exact).abs().max())
            except Exception as exc:  # a variant that fails to compile is reported, not fatal
                row["kernels"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            row["kernels"][name] = {"ms": ms, "max_err_vs_fp32": err, "Bps": tq_bytes / (ms * 1e-3), "vs_sdpa": ms / sdpa_ms,
                                    "frac_copy": tq_bytes / (ms * 1e-3) / res["copy_Bps"],
                                    "bf16_equiv_Bps": bf16_bytes / (ms * 1e-3)}
        res["cases"].append(row)
        if quick:
            continue
        qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
        ms = _median_ms(lambda: unified_attention(case["query"], case["cache"], case["block_table"], qsl,
                                                  case["seq_lens"], 1, preset=PRESET, rotation=case["rotation"]))
        row["kernels"]["unified-bf16"] = {"ms": ms, "Bps": tq_bytes / (ms * 1e-3), "vs_sdpa": ms / sdpa_ms,
                                          "frac_copy": tq_bytes / (ms * 1e-3) / res["copy_Bps"],
                                          "bf16_equiv_Bps": bf16_bytes / (ms * 1e-3)}
        del case
        torch.cuda.empty_cache()
    return res


def table(res: dict) -> str:
    lines = [f"{res['device']}  copy {res['copy_Bps'] / 1e12:.2f} TB/s (read+write)",
             f"{'L':>6} {'kernel':24} {'ms':>8} {'TB/s':>6} {'%copy':>6} {'x sdpa':>7} {'bf16-eq TB/s':>12} {'err':>8}"]
    for row in res["cases"]:
        lines.append(f"{row['L']:>6} {'torch-sdpa bf16':24} {row['sdpa_ms']:8.4f} {row['sdpa_Bps'] / 1e12:6.2f}")
        for name, k in row["kernels"].items():
            if "error" in k:
                lines.append(f"{row['L']:>6} {name:24} ERROR {k['error'][:80]}")
                continue
            lines.append(f"{row['L']:>6} {name:24} {k['ms']:8.4f} {k['Bps'] / 1e12:6.2f} {100 * k['frac_copy']:5.1f}% "
                         f"{k['vs_sdpa']:7.3f} {k['bf16_equiv_Bps'] / 1e12:12.2f} {k.get('max_err_vs_fp32', float('nan')):8.1e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--quick", action="store_true", help="one length (8192), the grouped-decode sweep alone")
    args = ap.parse_args(argv)
    res = run(lengths=(8192,) if args.quick else (8192, 32768), quick=args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
