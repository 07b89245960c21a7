"""Builds of the C++ GDN module from several source trees, timed side by side on the chunked prefill
(``python3 -m bench.probes.gdn_prefill_builds --build NAME=SRC [--build NAME=SRC ...] --out DIR``).

Each SRC (a tree with the project's ``CMakeLists.txt`` and ``optimized/cpu``, e.g. another commit's,
or ``.`` for this checkout) is built with CMake and Ninja into ``BUILD_ROOT/NAME`` (``--build-root``,
default ``build/prefill-builds``; the builds run in parallel, the module not copied next to its
sources). Then, loaded through
``KERNEL_LAB_GDN_MODULE``:

- each build computes one small prefill (3 sequences of 333, 700 and 64 tokens, Qwen3-Next heads,
  bf16 activations, bf16 and fp32 state pools with random states, 2 threads) and the outputs and
  final states are compared with the first build's (equal: the same numbers; the CPU kernels'
  rounding model fixes every rounding point, but not the fp32 summation order);
- ``bench.probes.gdn_prefill`` (1 x 8192 and 4 x 2048 tokens, its AMX ceilings measured in each
  process) runs once per build and round, the builds in turn (A B A B ...), each process pinned
  with ``taskset -c CPUS``.

The table printed last, per batch, state dtype and build: ms min / median / max over the rounds
(the minimum of the runs' minimums, the median of their medians, the maximum of their maximums),
the fraction of the two-thread AMX tile peak at the minimum (the peak measured in the same process
as that run), and that run's tile peak and the build's own GEMM at ``ceilings.GEMM_SHAPE`` (TFLOP/s
on 2 threads).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.probes.module_builds import build_modules, cpu_model

ROOT = Path(__file__).resolve().parents[2]


def env_for(so: Path) -> dict:
    return dict(os.environ, KERNEL_LAB_GDN_MODULE=str(so),
                PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep))


def emit(path: str) -> None:
    """The small prefill of the module KERNEL_LAB_GDN_MODULE names: outputs and states to an .npz."""
    import optimized.cpu as cpu
    from bench.gdn_cpu import HEADS, chunked_inputs

    got = {}
    for state in ("bfloat16", "float32"):
        x = chunked_inputs(dict(lens=[333, 700, 64], **HEADS, state_dtype=state, act="bfloat16"))
        pool = x["state"]
        pool[...] = (np.random.default_rng(2).normal(size=pool.shape) * 0.1).astype(pool.dtype)
        out = cpu.gdn_chunk_prefill(**x["args"], state=pool, num_threads=2)
        got[f"out_{state}"] = np.asarray(out).astype(np.float32)
        got[f"state_{state}"] = pool.astype(np.float32)
    np.savez(path, **got)


def compare(files: dict[str, Path]) -> list[str]:
    names = list(files)
    first = np.load(files[names[0]])
    lines = []
    for n in names[1:]:
        other = np.load(files[n])
        diffs = {k: float(np.abs(first[k] - other[k]).max()) for k in first.files}
        same = all(np.array_equal(first[k], other[k]) for k in first.files)
        lines.append(f"{n} vs {names[0]}: " + ("outputs and states equal" if same else
                     "DIFFER, max |diff| " + ", ".join(f"{k} {v:.3g}" for k, v in diffs.items())))
    return lines


def table(runs: list[tuple[str, dict]]) -> str:
    builds = list(dict.fromkeys(n for n, _ in runs))
    keys = list(dict.fromkeys((r["batch"], r["state"]) for _, res in runs for r in res["rows"] if "batch" in r))
    lines = [f"{'batch':7} {'state':9} {'build':12} {'runs':>4} {'ms min':>8} {'median':>8} {'max':>8} "
             f"{'of tile peak':>12} {'peak TFLOP/s':>12} {'GEMM TFLOP/s':>12}"]
    for batch, state in keys:
        for b in builds:
            rows = [r for n, res in runs if n == b for r in res["rows"]
                    if r.get("batch") == batch and r.get("state") == state]
            if not rows:
                continue
            best = min(rows, key=lambda r: r["ours"]["min"])
            frac = f"{best['frac_amx_peak']:12.1%}" if best.get("frac_amx_peak") else f"{'-':>12}"
            peak = f"{best['amx_peak_TFLOPs']:12.2f}" if best.get("amx_peak_TFLOPs") else f"{'-':>12}"
            gemm = f"{best['amx_gemm_TFLOPs']:12.2f}" if best.get("amx_gemm_TFLOPs") else f"{'-':>12}"
            lines.append(f"{batch:7} {state:9} {b:12} {len(rows):4d} {best['ours']['min']:8.1f} "
                         f"{np.median([r['ours']['median'] for r in rows]):8.1f} "
                         f"{max(r['ours']['max'] for r in rows):8.1f} {frac} {peak} {gemm}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", default=[], metavar="NAME=SRC",
                    help="a source tree to build and time under NAME (repeat; the first is the reference)")
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/out/prefill-builds"), help="folder for the runs")
    ap.add_argument("--build-root", default=str(ROOT / "build" / "prefill-builds"))
    ap.add_argument("--cpus", default="2,3", help="taskset CPU list of the timed runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="calls per shape in each run (bench.probes.gdn_prefill)")
    ap.add_argument("--emit", help=argparse.SUPPRESS)   # internal: one build's small prefill to this .npz
    a = ap.parse_args(argv)
    if a.emit:
        emit(a.emit)
        return 0
    if not a.build:
        ap.error("--build NAME=SRC: at least one")
    jobs = []
    for spec in a.build:
        name, sep, src = spec.partition("=")
        if not sep or not name or not (Path(src) / "CMakeLists.txt").is_file():
            ap.error(f"--build {spec}: expected NAME=SRC with SRC/CMakeLists.txt")
        jobs.append((name, Path(src).resolve()))
    if len({n for n, _ in jobs}) != len(jobs):
        ap.error("--build: names must differ")
    print(f"{cpu_model()}, {os.cpu_count()} CPUs; timed runs pinned to {a.cpus}", flush=True)
    t0 = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sos = build_modules(dict(jobs), Path(a.build_root))

    files = {}
    for n, so in sos.items():
        files[n] = out / f"check-{n}.npz"
        subprocess.run([sys.executable, "-m", "bench.probes.gdn_prefill_builds", "--emit", str(files[n])],
                       cwd=ROOT, env=env_for(so), check=True)
    check = compare(files)
    print("\n".join(check), flush=True)

    runs: list[tuple[str, dict]] = []
    for r in range(a.rounds):
        for n, so in sos.items():
            path = out / f"{len(runs):02d}-{n}.json"
            t = time.monotonic()
            with open(out / f"{len(runs):02d}-{n}.log", "w") as log:
                rc = subprocess.run(["taskset", "-c", a.cpus, sys.executable, "-m", "bench.probes.gdn_prefill",
                                     "--threads", "2", "--reps", str(a.reps), "--out", str(path)],
                                    cwd=ROOT, env=env_for(so), stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                print(f"{path.name}: rc {rc}\n" + (out / f"{len(runs):02d}-{n}.log").read_text()[-2000:],
                      file=sys.stderr)
                return 1
            runs.append((n, json.loads(path.read_text())))
            print(f"round {r + 1} {n}: {time.monotonic() - t:.0f} s, at {time.monotonic() - t0:.0f} s", flush=True)
    print("\n".join(check))
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
