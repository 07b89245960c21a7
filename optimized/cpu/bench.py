"""Decode timing of the C++ GDN kernels per state dtype, the measurement behind the decode perf gate
of tests/perf/test_gdn_cpu_perf.py (`python3 -m optimized.cpu.bench`).

Qwen3-Next shapes (H=16, HV=32, K=V=128), batch 128, state slots in a random order. The fp32,
bf16 and fp16 state pools are decoded in turn (A B C A B C ...) so that all see the same machine
load; minimums (the least disturbed calls) and medians are reported, with the fp32/bf16 and
fp32/fp16 ratios of the minimums.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import ml_dtypes
import numpy as np

H, HV, K, V = 16, 32, 128, 128
BATCH = 128
BF16 = np.dtype(ml_dtypes.bfloat16)
STATE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": BF16, "float16": np.dtype(np.float16)}


def interleaved_seconds(fns: dict, reps: int) -> dict[str, np.ndarray]:
    """Times of each fn, called in turn (A B A B ...) so that both see the same machine load."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: np.array(t) for name, t in times.items()}


def decode_inputs(rng, N: int) -> dict:
    """Decode arguments for N sequences (bf16 activations), all but the state pool."""
    return dict(q=rng.normal(size=(N, H, K)).astype(BF16), k=rng.normal(size=(N, H, K)).astype(BF16),
                v=rng.normal(size=(N, HV, V)).astype(BF16), A_log=rng.normal(size=HV).astype(np.float32),
                a=rng.normal(size=(N, HV)).astype(BF16), b=rng.normal(size=(N, HV)).astype(BF16),
                dt_bias=rng.normal(size=HV).astype(BF16), state_indices=rng.permutation(N).astype(np.int32))


def decode_runs(threads: int, isa: str = "auto", dtypes=tuple(STATE_DTYPES)) -> tuple[dict, dict]:
    """``(pools, runs)``: a batch-128 state pool per dtype name in ``dtypes`` (seeded, the same
    values rounded to each dtype) and a no-argument callable decoding one step into it."""
    import optimized.cpu as cpu

    rng = np.random.default_rng(0)
    args = decode_inputs(rng, BATCH)
    pools = {name: rng.normal(0, 0.5, (BATCH, HV, K, V)).astype(np.float32).astype(STATE_DTYPES[name])
             for name in dtypes}
    runs = {name: (lambda p=pool: cpu.gdn_decode(**args, state=p, num_threads=threads, isa=isa))
            for name, pool in pools.items()}
    return pools, runs


def decode_by_state_dtype(threads: int, isa: str = "auto", reps: int = 15, dtypes=tuple(STATE_DTYPES)) -> dict:
    """{"ms_min": {dtype: ms}, "ms_median": {...}} of batch-128 decodes, interleaved over ``dtypes``."""
    _, runs = decode_runs(threads, isa, dtypes)
    times = interleaved_seconds(runs, reps)
    return {"ms_min": {n: float(np.min(t)) * 1e3 for n, t in times.items()},
            "ms_median": {n: float(np.median(t)) * 1e3 for n, t in times.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="thread counts (default 2)")
    ap.add_argument("--isa", nargs="+", default=["auto"], help="code paths: auto, amx, avx512, scalar")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'threads':>7} {'isa':>6} {'fp32 ms':>8} {'bf16 ms':>8} {'fp16 ms':>8} {'fp32/bf16':>9} {'fp32/fp16':>9}")
    for threads in args.threads:
        for isa in args.isa:
            r = decode_by_state_dtype(threads, isa, args.reps)
            m = r["ms_min"]
            rows.append(dict(threads=threads, isa=isa, **r))
            print(f"{threads:>7} {isa:>6} {m['float32']:8.2f} {m['bfloat16']:8.2f} {m['float16']:8.2f} "
                  f"{m['float32'] / m['bfloat16']:9.3f} {m['float32'] / m['float16']:9.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
