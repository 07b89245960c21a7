"""Stage profile of the C++ chunked prefill
(``python3 -m bench.probes.gdn_prefill_stages [--src TREE] [--cpus 0,1] [--threads 2] --out DIR``).

Builds the module from SRC (a tree with the project's ``CMakeLists.txt`` and ``optimized/cpu``; default
this checkout) with the stage clocks (CMake ``-DGDN_STAGE_CLOCKS=ON``; ``ChunkClock`` in
``optimized/cpu/gdn_api.hpp``) into ``BUILD_ROOT/stages``, then in one process that loads it through
``KERNEL_LAB_GDN_MODULE``, pinned with ``taskset -c CPUS``: one warm-up call, then ``--reps`` calls of one
batch of ``bench.probes.gdn_prefill`` (Qwen3-Next heads, bf16 activations; 1 x 8192 or 4 x 2048 tokens,
a bf16 or fp32 pool) on ``--threads`` threads. Printed per stage: milliseconds per call summed over the
threads, the share of the sum, and for the stages with GEMMs (their operand packing included) the GFLOP
of their products and the milliseconds those take at the one-thread AMX tile peak measured in the same
process (thread-milliseconds both, so the two compare). The wall time per call (min / median) is printed
beside the sum. The clocks read the steady clock about 20 times per chunk and value head.
Writes ``stages.json`` (the rows, the ceilings, the call times) to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.probes.module_builds import build_modules, cpu_model

ROOT = Path(__file__).resolve().parents[2]


def stage_flops(N: int, L: int) -> dict[str, float]:
    """GEMM FLOPs per stage of N sequences of L tokens (chunks of C = 64; every product counted whole)."""
    from bench.probes.gdn_prefill import C, H, HV, K, V
    steps = N * -(-L // C) * HV                       # chunk x value-head steps
    return {"key gemms": N * -(-L // C) * H * 2 * 2 * C * C * K,   # k k^T, q k^T per key head
            "W U Vn": steps * 2 * C * (C * (K + V) + K * V),
            "out": steps * 2 * C * (K + C) * V, "state update": steps * 2 * K * C * V}


def run(batch: str, state: str, threads: int, reps: int) -> dict:
    """In the process that loaded the clocked build: the clocks per call of ``reps`` calls."""
    import numpy as np

    import optimized.cpu as cpu
    from bench.probes.gdn_prefill import BATCHES, amx_ceilings, ours, prefill_inputs
    ext = cpu._ext()
    if not ext.STAGE_CLOCKS:
        raise SystemExit("the module loaded was built without GDN_STAGE_CLOCKS")
    N, L = BATCHES[batch]
    x = prefill_inputs(N, L, state)
    call = ours(x["args"], x["state"], threads)
    call()
    ext.chunk_stage_clocks(True)
    wall = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        wall.append(time.perf_counter() - t)
    clocks = {k: v / reps for k, v in ext.chunk_stage_clocks(True).items()}
    ceil = amx_ceilings(threads) if cpu.isa_status()["amx"][0] else {}
    return {"batch": batch, "state": state, "threads": threads, "reps": reps, "clocks_s": clocks,
            "wall_ms": {"min": min(wall) * 1e3, "median": float(np.median(wall)) * 1e3},
            "flops": stage_flops(N, L), "ceilings": ceil}


def table(r: dict) -> list[str]:
    """One line per stage: thread-ms per call, share, GFLOP, thread-ms at the one-thread tile peak."""
    peak = r["ceilings"].get("tile_peak_TFLOPs_1t")
    total = sum(r["clocks_s"].values())
    lines = [f"{'stage':14s} {'ms':>8s} {'share':>6s} {'GFLOP':>7s} {'ms at peak':>10s}"]
    for name, s in r["clocks_s"].items():
        f = r["flops"].get(name)
        extra = f"{f / 1e9:7.2f} " + (f"{f / (peak * 1e12) * 1e3:10.2f}" if peak else f"{'-':>10s}") if f else ""
        lines.append(f"{name:14s} {s * 1e3:8.2f} {s / total:6.1%} {extra}")
    w = r["wall_ms"]
    lines.append(f"{'sum':14s} {total * 1e3:8.2f}   (wall per call min {w['min']:.1f} / median {w['median']:.1f} ms "
                 f"on {r['threads']} threads; tile peak {peak or 0:.2f} TFLOP/s on one thread)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=".", help="source tree to build with the stage clocks (default: this checkout)")
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/out/prefill-stages"), help="folder for stages.json")
    ap.add_argument("--build-root", default=str(ROOT / "build" / "prefill-stages"))
    ap.add_argument("--cpus", default="2,3", help="taskset CPU list of the timed process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", default="1x8192", choices=("1x8192", "4x2048"))
    ap.add_argument("--state", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--run", help=argparse.SUPPRESS)   # internal: the timed process writes its JSON here
    a = ap.parse_args(argv)
    if a.threads < 1 or a.reps < 1:
        ap.error("--threads and --reps: expected integers >= 1")
    if a.run:
        Path(a.run).write_text(json.dumps(run(a.batch, a.state, a.threads, a.reps)))
        return 0
    src = Path(a.src).resolve()
    if not (src / "CMakeLists.txt").is_file():
        ap.error(f"--src {a.src}: expected a tree with CMakeLists.txt and optimized/cpu")
    module = build_modules({"stages": src}, Path(a.build_root), cmake_args="-DGDN_STAGE_CLOCKS=ON")["stages"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KERNEL_LAB_GDN_MODULE=str(module), PYTHONPATH=str(ROOT))
    cmd = ["taskset", "-c", a.cpus, sys.executable, "-m", "bench.probes.gdn_prefill_stages", "--run",
           str(out / "stages.json"), "--threads", str(a.threads), "--reps", str(a.reps), "--batch", a.batch,
           "--state", a.state]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    r = json.loads((out / "stages.json").read_text())
    print(f"{cpu_model()}; {a.batch}, {a.state} pool, {a.threads} threads on CPUs {a.cpus}, {a.reps} calls; "
          f"source {src}")
    print("\n".join(table(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
