"""Chunked-prefill timing of the C++ GDN kernel against vLLM's CPU kernel
(`python3 -m bench.probes.gdn_prefill`).

Qwen3-Next shapes (H=16, HV=32, K=V=128), the inputs of the registry's ``gdn/chunked`` bench
(bf16 activations, l2-normalised q and k), fp32 or bf16 state pool (zero at the start);
batches 1 x 8192 and 4 x 2048 tokens. Ours and the peer (vLLM's
``torch.ops._C.chunk_gated_delta_rule_cpu``, loaded from the ``_C`` library given by ``--vllm-lib``)
run on the same inputs, called in turn (A B A B ...) so that both see the same machine load; each
updates its own copy of the state pool in place. Reported: min / median / max ms, the ratio of the
minimums and of the medians, TFLOP/s against two AMX ceilings measured in the same run (when the
CPU has AMX): the square-tile peak (register-resident tdpbf16ps) and the kernel's own GEMM at the
shape of its tile products (``optimized.cpu.ceilings.GEMM_SHAPE``, operands in cache), each on the
run's threads and on one thread (one physical core's AMX unit: SMT siblings share it; the
physical cores of this process are printed), and our 1 -> 2 thread scaling.
FLOP model per 64-token chunk and value head (the GEMMs): 6C^2K + 4C^2V + 6CKV.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from bench.gdn_cpu import HEADS, chunked_inputs
from bench.timing import interleaved
from conformance.numerics import ACTIVATIONS

BF16 = ACTIVATIONS["bfloat16"]

C = 64
H, HV, K, V = (HEADS[n] for n in ("H", "HV", "K", "V"))
BATCHES = {"1x8192": (1, 8192), "4x2048": (4, 2048)}
TIMED_STATE_DTYPES = ("float32", "bfloat16")


def prefill_flops(N: int, L: int) -> float:
    """GEMM FLOPs of the chunk algorithm for N sequences of L tokens."""
    per_chunk = 6 * C * C * K + 4 * C * C * V + 6 * C * K * V
    return float(N * -(-L // C) * HV * per_chunk)


def prefill_inputs(N: int, L: int, state_dtype: str) -> dict:
    """The registry's chunked-prefill inputs (bench.gdn_cpu.chunked_inputs): ``args`` and a zero
    state pool of ``state_dtype``, for N sequences of L tokens."""
    return chunked_inputs(dict(lens=[L] * N, **HEADS, state_dtype=state_dtype, act="bfloat16"))


def ours(args: dict, pool: np.ndarray, threads: int, isa: str = "auto", out: np.ndarray | None = None):
    """Our kernel; ``out``: a caller's output buffer, reused by every call (else a new one each)."""
    import optimized.cpu as cpu
    return lambda: cpu.gdn_chunk_prefill(**args, state=pool, num_threads=threads, isa=isa, out=out)


def vllm_peer(args: dict, pool: np.ndarray, threads: int):
    """vLLM's kernel on torch views of the same inputs ([1, T, ...], as vLLM passes them)."""
    import torch

    def t(x):
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16) if x.dtype == BF16 else torch.from_numpy(x)
    q, k, v, g, beta = (t(args[n]).unsqueeze(0) for n in ("q", "k", "v", "g", "beta"))
    state, cu, idx = t(pool), t(args["cu_seqlens"]), t(args["state_indices"])
    op = torch.ops._C.chunk_gated_delta_rule_cpu

    def run():
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            op(q, k, v, g, beta, state, True, cu, False, True, idx, 1e-6)
        finally:
            torch.set_num_threads(previous)
    return run


def amx_ceilings(threads: int) -> dict:
    """TFLOP/s of the tile peak and of the kernel's GEMM at GEMM_SHAPE, on one thread (one physical
    core's AMX unit) and on ``threads``, each the best of 5 calls after a warm-up call (an idle AMX
    unit starts slow); ``amx_units``: the ratio of the two tile peaks, the AMX units the threads
    really had (a VM may put two vCPUs on one physical core without saying so)."""
    from optimized.cpu import ceilings

    out = {"physical_cores": ceilings.physical_cores(), "gemm_shape": list(ceilings.GEMM_SHAPE)}
    for n in sorted({1, threads}):
        peak = ceilings.amx_tile_peak(n)
        gemm = ceilings.amx_gemm(*ceilings.GEMM_SHAPE, n)
        peak(), gemm()
        out[f"tile_peak_TFLOPs_{n}t"] = max(ceilings.AMX_PEAK_ITERS * ceilings.AMX_FLOPS_PER_ITER * n / peak()
                                            for _ in range(5)) / 1e12
        out[f"gemm_TFLOPs_{n}t"] = max(ceilings.gemm_flops(*ceilings.GEMM_SHAPE, n) / gemm()
                                       for _ in range(5)) / 1e12
    out["amx_units"] = out[f"tile_peak_TFLOPs_{threads}t"] / out["tile_peak_TFLOPs_1t"]
    return out


def summary(t: np.ndarray) -> dict:
    return {"min": float(t.min()) * 1e3, "median": float(np.median(t)) * 1e3, "max": float(t.max()) * 1e3,
            "n": int(t.size)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="auto", help="our code path: auto, amx, avx512, scalar")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batches", nargs="+", default=list(BATCHES), choices=list(BATCHES))
    ap.add_argument("--states", nargs="+", default=list(TIMED_STATE_DTYPES), choices=TIMED_STATE_DTYPES)
    ap.add_argument("--vllm-lib", help="vLLM's _C extension library (leave out: ours alone)")
    ap.add_argument("--reuse-out", action="store_true",
                    help="also time ours writing into one preallocated output (no first-touch page faults)")
    ap.add_argument("--scaling", action="store_true", help="also time ours on 1 thread (1 x 8192, bf16 state)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    import optimized.cpu as cpu

    if args.vllm_lib:
        import torch
        torch.ops.load_library(args.vllm_lib)
    amx_ok, amx_why = cpu.isa_status()["amx"]
    amx = amx_ceilings(args.threads) if amx_ok else None
    peak = amx[f"tile_peak_TFLOPs_{args.threads}t"] * 1e12 if amx else None
    gemm = amx[f"gemm_TFLOPs_{args.threads}t"] * 1e12 if amx else None
    rows = []
    print(f"{'batch':>7} {'state':>9} {'ours min/med/max ms':>22} {'vllm min/med/max ms':>22} "
          f"{'ratio min':>9} {'ratio med':>9} {'TFLOP/s':>8} {'of peak':>8} {'of gemm':>8}")
    for batch in args.batches:
        N, L = BATCHES[batch]
        for sname in args.states:
            inputs = prefill_inputs(N, L, sname)
            fns = {"ours": ours(inputs["args"], inputs["state"].copy(), args.threads, args.isa)}
            if args.reuse_out:
                buf = np.zeros((N * L, HV, V), BF16)
                fns["ours_out_reused"] = ours(inputs["args"], inputs["state"].copy(), args.threads, args.isa, buf)
            if args.vllm_lib:
                fns["vllm"] = vllm_peer(inputs["args"], inputs["state"].copy(), args.threads)
            times = interleaved(fns, args.reps)
            row = dict(batch=batch, state=sname, threads=args.threads, isa=args.isa,
                       **{name: summary(t) for name, t in times.items()})
            tflops = prefill_flops(N, L) / (row["ours"]["min"] * 1e-3) / 1e12
            row.update(TFLOPs=tflops, amx_peak_TFLOPs=peak / 1e12 if peak else None,
                       frac_amx_peak=tflops * 1e12 / peak if peak else None,
                       amx_gemm_TFLOPs=gemm / 1e12 if gemm else None,
                       frac_amx_gemm=tflops * 1e12 / gemm if gemm else None)
            line = f"{batch:>7} {sname:>9} " + "{min:6.1f} {median:6.1f} {max:6.1f}".format(**row["ours"]).rjust(22)
            if "vllm" in row:
                row["ratio_min"] = row["ours"]["min"] / row["vllm"]["min"]
                row["ratio_median"] = row["ours"]["median"] / row["vllm"]["median"]
                line += " " + "{min:6.1f} {median:6.1f} {max:6.1f}".format(**row["vllm"]).rjust(22)
                line += f" {row['ratio_min']:9.3f} {row['ratio_median']:9.3f}"
            else:
                line += " " + "-".rjust(22) + " " * 20
            line += f" {tflops:8.3f} " + (f"{row['frac_amx_peak']:8.1%} {row['frac_amx_gemm']:8.1%}" if peak
                                          else "   no AMX")
            if "ours_out_reused" in row:
                line += "  out reused: {min:6.1f} {median:6.1f} {max:6.1f}".format(**row["ours_out_reused"])
            rows.append(row)
            print(line, flush=True)
    if amx:
        print(f"AMX ceilings, TFLOP/s ({amx['physical_cores']} physical cores for this process, "
              f"{amx['amx_units']:.2f} AMX units' worth on {args.threads} threads): tile peak "
              f"{amx['tile_peak_TFLOPs_1t']:.3f} on 1 thread (per physical core), {peak / 1e12:.3f} on "
              f"{args.threads}; GEMM {'x'.join(map(str, amx['gemm_shape']))} {amx['gemm_TFLOPs_1t']:.3f} on 1 thread, "
              f"{gemm / 1e12:.3f} on {args.threads}")
    else:
        print(f"AMX peak not measured: {amx_why}")
    if args.scaling:
        inputs = prefill_inputs(1, 8192, "bfloat16")
        fns = {n: ours(inputs["args"], inputs["state"], n, args.isa) for n in (1, args.threads)}
        times = interleaved(fns, max(3, args.reps // 2))
        s = {n: summary(t) for n, t in times.items()}
        scaling = s[1]["min"] / s[args.threads]["min"]
        rows.append(dict(scaling_1x8192_bf16={str(n): v for n, v in s.items()}, scaling=scaling))
        print(f"scaling 1 -> {args.threads} threads (1x8192, bf16 state, min): "
              f"{s[1]['min']:.1f} -> {s[args.threads]['min']:.1f} ms = {scaling:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, amx=[amx_ok, amx_why], amx_ceilings=amx), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
