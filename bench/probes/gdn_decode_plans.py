"""The C++ GDN decode's plans (``optimized.cpu.DECODE_PLANS``) side by side
(`python3 -m bench.probes.gdn_decode_plans --out DIR`).

For each state dtype, the inputs of the registry's ``gdn/decode`` bench (batch 128, H=16, HV=32,
K=V=128, bf16 activations) and ONE state pool, which every plan updates in turn (as the bench's one
pool: the pool and the stream buffer together fit the Xeon's L3, more copies would not); the
in-place stream over a buffer of the pool's size (``cpu-rmw-stream``, the gates' ceiling) timed in
the same rounds (A B C ... interleaved). Reported per plan: ms min / median / max and the fraction
of the stream's GB/s (decode bytes as the bench counts them) as the gates take it (median of the
paired per-round ratios) and from the minimums. Before timing, each plan runs once from the same
pool as ``pipelined`` and must give the same bits (output and state). "hot": one sequence (32
items, the state in L2) on one thread, us per item of the whole call (its fixed costs included:
argument checks, gating, and one unpipelined pass per run of 4 items).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import optimized.cpu as cpu
from bench.gdn_cpu import HEADS, THREADS, decode_inputs
from bench.timing import interleaved, summary
from conformance.families.gdn import cost
from optimized.cpu import ceilings

TIMED_STATE_DTYPES = ("float32", "bfloat16", "float16")
PLAN_VARIABLE = "KERNEL_LAB_GDN_DECODE_PLAN"


def _decode(inputs: dict, pool: np.ndarray, plan: str, threads: int):
    def run():
        os.environ[PLAN_VARIABLE] = plan
        return cpu.gdn_decode(**inputs["args"], state=pool, num_threads=threads)
    return run


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.view(np.uint16 if x.itemsize == 2 else np.uint32)


def same_bits(inputs: dict, plans: list[str], threads: int) -> dict[str, bool]:
    """{plan: output and state bitwise equal to pipelined's from the same pool}."""
    ref_pool = inputs["state"].copy()
    ref_out = _bits(_decode(inputs, ref_pool, "pipelined", threads)())
    ref_pool = _bits(ref_pool)
    result = {}
    for plan in plans:
        pool = inputs["state"].copy()
        out = _bits(_decode(inputs, pool, plan, threads)())
        result[plan] = bool(np.array_equal(out, ref_out) and np.array_equal(_bits(pool), ref_pool))
    return result


def fractions(shape: dict, times: dict, plans: list[str]) -> dict:
    """Per plan: decode GB/s over the stream's, median of paired rounds and from the minimums."""
    decode_bytes, stream_bytes = cost.decode(shape).bytes, 2 * cost.state_bytes(shape)
    stream = times["stream"]
    out = {}
    for plan in plans:
        paired = (decode_bytes / times[plan]) / (stream_bytes / stream)
        out[plan] = {"paired_median": float(np.median(paired)),
                     "paired_q25_q75": [float(q) for q in np.quantile(paired, [0.25, 0.75])],
                     "of_minimums": float((decode_bytes / times[plan].min()) / (stream_bytes / stream.min()))}
    return out


def hot(state_dtype: str, plans: list[str], reps: int) -> dict:
    """us per item of whole calls, one sequence (32 items) on one thread, min / median over ``reps`` calls."""
    shape = dict(N=1, **HEADS, state_dtype=state_dtype, act="bfloat16")
    inputs = decode_inputs(shape)
    pool = inputs["state"].copy()
    times = interleaved({p: _decode(inputs, pool, p, 1) for p in plans}, reps)
    items = shape["N"] * shape["HV"]
    return {p: {"us_per_item_min": float(t.min() / items * 1e6), "us_per_item_median": float(np.median(t) / items * 1e6)}
            for p, t in times.items()}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for gdn_cpu_decode_plans.json")
    ap.add_argument("--plans", default=",".join(cpu.DECODE_PLANS), help="comma-separated, of " + ",".join(cpu.DECODE_PLANS))
    ap.add_argument("--dtypes", default=",".join(TIMED_STATE_DTYPES), help="state dtypes, comma-separated")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--hot-reps", type=int, default=30)
    ap.add_argument("--commit", help="the commit measured, for the JSON (default: git rev-parse HEAD here)")
    a = ap.parse_args(argv)
    plans = [p for p in a.plans.split(",") if p]
    bad = [p for p in plans if p not in cpu.DECODE_PLANS]
    if bad:
        ap.error(f"--plans: unknown {bad}; expected some of {cpu.DECODE_PLANS}")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if any(d not in TIMED_STATE_DTYPES for d in dtypes):
        ap.error(f"--dtypes: expected some of {TIMED_STATE_DTYPES}, got {a.dtypes!r}")
    built, why = cpu.extension_status()
    if not built:
        print(why, file=sys.stderr)
        return 2
    isa = next(i for i in cpu.ISAS if cpu.isa_status()[i][0])
    report = {"probe": "gdn_decode_plans", "commit": a.commit or _commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cpu": _cpu_model(), "isa": isa, "threads": a.threads, "affinity": sorted(os.sched_getaffinity(0)),
              "physical_cores": ceilings.physical_cores(), "reps": a.reps, "shapes": {}}
    rows = []
    try:
        for dt in dtypes:
            shape = dict(N=128, **HEADS, state_dtype=dt, act="bfloat16", threads=a.threads)
            inputs = decode_inputs(shape)
            exact = same_bits(inputs, plans, a.threads)
            pool = inputs["state"]
            fns = {"stream": ceilings.rmw_stream(cost.state_bytes(shape), a.threads)}
            fns.update({p: _decode(inputs, pool, p, a.threads) for p in plans})
            times = interleaved(fns, a.reps)
            frac = fractions(shape, times, plans)
            hot_us = hot(dt, plans, a.hot_reps)
            report["shapes"][f"state={dt}"] = {
                "same_bits_as_pipelined": exact, "ms": {n: {k: v * 1e3 if k != "n" else v for k, v in summary(t).items()}
                                                        for n, t in times.items()},
                "fraction_of_stream": frac, "hot": hot_us}
            for p in plans:
                rows.append((dt, p, times[p].min() * 1e3, float(np.median(times[p])) * 1e3, times["stream"].min() * 1e3,
                             frac[p]["paired_median"], frac[p]["of_minimums"], hot_us[p]["us_per_item_min"], exact[p]))
            del inputs, pool, fns
    finally:
        os.environ.pop(PLAN_VARIABLE, None)
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "gdn_cpu_decode_plans.json", "w") as f:
            json.dump(report, f, indent=1)
    print(f"{'state':9} {'plan':13} {'min ms':>7} {'med ms':>7} {'stream':>7} {'frac':>6} {'f(min)':>6} {'hot us':>6} bits")
    for dt, p, mn, md, st, fr, fm, hu, ex in rows:
        print(f"{dt:9} {p:13} {mn:7.2f} {md:7.2f} {st:7.2f} {fr:6.3f} {fm:6.3f} {hu:6.2f} {'same' if ex else 'DIFFER'}")
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
