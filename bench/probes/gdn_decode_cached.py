"""The C++ GDN decode on cached state against the same decode streaming its pool
(`python3 -m bench.probes.gdn_decode_cached [--out DIR]`): is the decode limited by its arithmetic or
by the memory?

Per state dtype (fp32, bf16, fp16; bf16 activations, K = V = 128, the plan of this process):

- cached: one thread, pools of 8 and 24 items (H=4, HV=8; N = 1 and 3 sequences), at most 1.5 MiB, so
  they stay in a 2 MiB L2 across calls; the time per item is the difference of the two calls' minimum
  times over the 16 items between them, so the fixed costs of a call (argument checks, the Python
  wrapper, the unpipelined passes at the ends of a run) cancel: the arithmetic-bound time per item;
- streamed: the registry's ``gdn/decode`` inputs (batch 128, H=16, HV=32, 128 MiB bf16 pool) on
  ``--threads`` threads beside the in-place stream of a buffer of the pool's size (``cpu-rmw-stream``),
  interleaved rounds; per item and thread: the decode's time and the stream's.

``overlap`` = (cached + stream - streamed) / cached per item: 1 when the arithmetic hides entirely
under the memory traffic, 0 when the two add up (below 0: the decode is slower than both in series).
Printed as a table; ``--out`` also writes gdn_decode_cached.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

import optimized.cpu as cpu
from bench.gdn_cpu import HEADS, THREADS, decode_inputs
from bench.timing import interleaved
from conformance.families.gdn import cost
from optimized.cpu import ceilings

STATE_DTYPES = ("float32", "bfloat16", "float16")
CACHED_HEADS = dict(H=4, HV=8, K=128, V=128)
CACHED_N = (1, 3)


def _call(inputs: dict, pool: np.ndarray, threads: int):
    return lambda: cpu.gdn_decode(**inputs["args"], state=pool, num_threads=threads)


def cached_us_per_item(state_dtype: str, reps: int) -> float:
    """Arithmetic-bound us per item: one thread, L2-resident pools, difference of two call sizes."""
    fns, items = {}, {}
    for n in CACHED_N:
        shape = dict(N=n, **CACHED_HEADS, state_dtype=state_dtype, act="bfloat16")
        inputs = decode_inputs(shape)
        fns[n] = _call(inputs, inputs["state"], 1)
        items[n] = n * CACHED_HEADS["HV"]
    times = interleaved(fns, reps)
    lo, hi = CACHED_N
    return float((times[hi].min() - times[lo].min()) / (items[hi] - items[lo]) * 1e6)


def streamed(state_dtype: str, threads: int, reps: int) -> dict:
    """us per item and thread of the bench's decode and of the in-place stream (medians of interleaved rounds)."""
    shape = dict(N=128, **HEADS, state_dtype=state_dtype, act="bfloat16", threads=threads)
    inputs = decode_inputs(shape)
    times = interleaved({"stream": ceilings.rmw_stream(cost.state_bytes(shape), threads),
                         "decode": _call(inputs, inputs["state"], threads)}, reps)
    per = threads / (shape["N"] * shape["HV"]) * 1e6
    frac = (cost.decode(shape).bytes / times["decode"]) / (2 * cost.state_bytes(shape) / times["stream"])
    return {"decode_us": float(np.median(times["decode"]) * per), "stream_us": float(np.median(times["stream"]) * per),
            "fraction_median": float(np.median(frac))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for gdn_decode_cached.json (default: print only)")
    ap.add_argument("--dtypes", default=",".join(STATE_DTYPES), help="state dtypes, comma-separated")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--reps", type=int, default=15, help="rounds of the streamed timing")
    ap.add_argument("--cached-reps", type=int, default=200, help="rounds of the cached timing")
    a = ap.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    if not dtypes or any(d not in STATE_DTYPES for d in dtypes):
        ap.error(f"--dtypes: expected some of {STATE_DTYPES}, got {a.dtypes!r}")
    if a.threads < 1 or a.reps < 1 or a.cached_reps < 1:
        ap.error("--threads, --reps, --cached-reps: expected integers >= 1")
    built, why = cpu.extension_status()
    if not built:
        ap.exit(2, why + "\n")
    rows = {}
    for dt in dtypes:
        c = cached_us_per_item(dt, a.cached_reps)
        s = streamed(dt, a.threads, a.reps)
        rows[dt] = {"cached_us": c, **s, "overlap": (c + s["stream_us"] - s["decode_us"]) / c}
    print(f"plan {cpu.decode_plan()}, {a.threads} threads; us per item (and thread)")
    print(f"{'state':9} {'cached':>7} {'stream':>7} {'decode':>7} {'overlap':>7} {'fraction':>8}")
    for dt, r in rows.items():
        print(f"{dt:9} {r['cached_us']:7.2f} {r['stream_us']:7.2f} {r['decode_us']:7.2f} {r['overlap']:7.2f} "
              f"{r['fraction_median']:8.3f}")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gdn_decode_cached.json").write_text(json.dumps(
            {"plan": cpu.decode_plan(), "threads": a.threads, "affinity": sorted(os.sched_getaffinity(0)),
             "dtypes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
