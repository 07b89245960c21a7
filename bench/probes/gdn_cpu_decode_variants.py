"""Builds of the C++ GDN decode with its compile-time tuning (``gdn_kernels.hpp``, "Decode tuning")
timed side by side in the registry's ``gdn/decode`` bench
(``python3 -m bench.probes.gdn_cpu_decode_variants --out DIR [--baseline-src SRC] [--variants a,b]``).

Every variant (``VARIANTS``: name and ``-D`` definitions) is built from this checkout with CMake and
Ninja into ``build/decode-variants/NAME`` (``GDN_DECODE_DEFS``, the module not copied next to the
sources; the builds run in parallel); ``--baseline-src`` (a source tree with its own
``CMakeLists.txt``, e.g. another commit's) is built the same way as ``baseline``. Then each build
runs the whole bench in its own process, loaded through ``KERNEL_LAB_GDN_MODULE``, pinned with
``taskset -c CPUS`` (default 0,1: the bench's 2 threads on two cores) and ``OMP_WAIT_POLICY=PASSIVE``,
``--no-remeasure`` (one measurement per run; the bench's own 15 rounds): the baseline first, the
variants in order, the baseline again, then the variants again in the same order and the
baseline once more, each run only while it and a closing baseline fit in ``--budget`` seconds
(from the start, builds included; ``VARIANTS`` lists the most telling first). Each run's perf JSON
is ``DIR/NN-NAME/perf.json``.

The table printed last, per build and state dtype over all its runs: the in-place stream's and the
decode's ms (median of the rounds), and the fraction of the stream (decode GB/s over the stream's
GB/s, paired by round as the gates pair them): min / median / max over the rounds, with the
number of runs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

# name -> definitions (gdn_kernels.hpp, "Decode tuning"); "default": none.
VARIANTS: dict[str, list[str]] = {   # in the order of the first round (those that fit the budget)
    "default": [],
    "ahead2k": ["GDN_PREFETCH_BYTES=2048"],           # 16-bit: 8 rows, fp32: 4 (fp32's lead in bytes)
    "streams8": ["GDN_ROW_STREAMS=8"],
    "ahead4k": ["GDN_PREFETCH_BYTES=4096"],           # 16-bit: 16 rows, fp32: 8
    "reuse-qk": ["GDN_REUSE_QK=1"],
    "update-ahead4": ["GDN_UPDATE_AHEAD=4"],
    "l2-ahead2k": ["GDN_PREFETCH_LEVEL=2", "GDN_PREFETCH_BYTES=2048"],
    "streams8-ahead2k": ["GDN_ROW_STREAMS=8", "GDN_PREFETCH_BYTES=2048"],
    "streams2-ahead2k": ["GDN_ROW_STREAMS=2", "GDN_PREFETCH_BYTES=2048"],
    "streams1-ahead8": ["GDN_ROW_STREAMS=1", "GDN_PREFETCH_AHEAD=8"],
    "skew2": ["GDN_WALK_SKEW=2"],
    "no-next": ["GDN_PREFETCH_NEXT=0"],
    "ahead2": ["GDN_PREFETCH_AHEAD=2"],
}
DTYPES = (("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("bfloat16/act=float16", "bf16/a16"))


def build(name: str, src: Path, defs: list[str], build_root: Path, jobs: int) -> subprocess.Popen:
    """Starts the configure and build of one module; its log is build_root/NAME.log."""
    d = build_root / name
    shutil.rmtree(d, ignore_errors=True)
    cmd = (f"cmake -S {src} -B {d} -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_COPY_TO_SOURCE=OFF "
           f"-DPython_EXECUTABLE={sys.executable} '-DGDN_DECODE_DEFS={';'.join(defs)}' && ninja -C {d} -j {jobs}")
    log = open(build_root / f"{name}.log", "w")
    return subprocess.Popen(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT)


def module(build_root: Path, name: str) -> Path:
    found = sorted((build_root / name).glob("_gdn*.so"))
    if not found:
        raise SystemExit(f"build {name}: no module (log: {build_root / name}.log)")
    return found[0]


def bench_run(so: Path, out: Path, cpus: str) -> tuple[int, float]:
    """One registry bench run of gdn/decode with the module ``so``: (exit status, seconds)."""
    env = dict(os.environ, KERNEL_LAB_GDN_MODULE=str(so), OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(out / "bench.log", "w") as log:
        rc = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "bench", "--bench", "gdn/decode",
                             "--no-remeasure", "--out", str(out / "perf.json")],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - t0


def rounds(perf: dict, shape: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(stream seconds, decode seconds, fraction) per round of one shape of a perf JSON."""
    recs = {b["name"]: b for b in perf["benchmarks"]}
    s, o = recs.get(f"gdn/decode/state={shape}/cpu-rmw-stream"), recs.get(f"gdn/decode/state={shape}/cpu")
    if s is None or o is None:
        return None
    st, ot = np.array(s["stats"]["data"]), np.array(o["stats"]["data"])
    n = min(len(st), len(ot))
    frac = (o["extra_info"]["bytes"] / ot[:n]) / (s["extra_info"]["bytes"] / st[:n])
    return st, ot, frac


def gate_ratios(run: Path) -> str:
    """The run's fraction-of-the-stream gates: ratio (q25-q75) per state dtype."""
    try:
        results = json.loads((run / "gates.json").read_text())
    except (OSError, ValueError):
        return "(no gates.json)"
    got = {g["gate"]: g for g in results}
    parts = []
    for short in ("fp32", "bf16", "fp16"):
        g = got.get(f"gdn-decode-{short}-vs-rmw")
        if g and g["ratio"] is not None:
            parts.append(f"{short} {g['ratio']:.3f} ({g['spread'][0]:.3f}-{g['spread'][1]:.3f})")
    return ", ".join(parts) or "(none)"


def table(runs: list[tuple[str, Path]]) -> str:
    order = list(dict.fromkeys(name for name, _ in runs))
    lines = [f"{'build':18} {'state':8} {'runs':>4} {'stream ms':>9} {'decode ms':>9}  fraction min / median / max"]
    for name in order:
        perfs = [json.loads((p / "perf.json").read_text())
                 for n, p in runs if n == name and (p / "perf.json").is_file()]
        for shape, short in DTYPES:
            got = [r for r in (rounds(perf, shape) for perf in perfs) if r is not None]
            if not got:
                continue
            st, ot, fr = (np.concatenate([g[i] for g in got]) for i in range(3))
            lines.append(f"{name:18} {short:8} {len(got):4d} {np.median(st) * 1e3:9.2f} {np.median(ot) * 1e3:9.2f}  "
                         f"{fr.min():.3f} / {np.median(fr):.3f} / {fr.max():.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/out/decode-variants"), help="folder for the runs")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ",".join(VARIANTS))
    ap.add_argument("--baseline-src", help="source tree built as 'baseline', timed first and last")
    ap.add_argument("--build-root", default=str(ROOT / "build" / "decode-variants"))
    ap.add_argument("--cpus", default="0,1", help="taskset CPU list of the bench runs")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for builds and runs: a run starts only while it and a closing baseline fit")
    a = ap.parse_args(argv)
    names = [v for v in a.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        ap.error(f"--variants: unknown {unknown}; expected some of {','.join(VARIANTS)}")
    if a.baseline_src and not (Path(a.baseline_src) / "CMakeLists.txt").is_file():
        ap.error(f"--baseline-src {a.baseline_src}: no CMakeLists.txt there")
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    print(f"{model}, {os.cpu_count()} CPUs; runs pinned to {a.cpus}", flush=True)
    t0 = time.monotonic()
    out, build_root = Path(a.out), Path(a.build_root)
    out.mkdir(parents=True, exist_ok=True)
    build_root.mkdir(parents=True, exist_ok=True)
    jobs = [("baseline", Path(a.baseline_src).resolve(), [])] if a.baseline_src else []
    jobs += [(v, ROOT, VARIANTS[v]) for v in names]
    per = max(1, (os.cpu_count() or 2) // len(jobs))
    procs = [(n, build(n, src, defs, build_root, per)) for n, src, defs in jobs]
    failed = [n for n, p in procs if p.wait() != 0]
    for n in failed:
        print(f"build {n} failed:\n" + (build_root / f"{n}.log").read_text()[-3000:], file=sys.stderr)
    if failed:
        return 1
    print(f"built {len(jobs)} modules in {time.monotonic() - t0:.0f} s", flush=True)
    base = "baseline" if a.baseline_src else names[0]
    rest = [n for n in names if n != base]
    runs: list[tuple[str, Path]] = []
    took: list[float] = []

    def run(name: str) -> None:
        path = out / f"{len(runs):02d}-{name}"
        rc, sec = bench_run(module(build_root, name), path, a.cpus)
        runs.append((name, path))
        took.append(sec)
        print(f"{path.name}: rc {rc} (a failed gate is 1), {sec:.0f} s, at {time.monotonic() - t0:.0f} s; "
              f"gate ratios {gate_ratios(path)}", flush=True)
        if rc not in (0, 1):
            print((path / "bench.log").read_text()[-2000:], file=sys.stderr)

    def fits() -> bool:   # one more run and the closing baseline
        return time.monotonic() - t0 + 2 * max(took) <= a.budget

    run(base)
    for name in rest:
        if not fits():
            print(f"budget: first round stops before {name}", flush=True)
            break
        run(name)
    run(base)
    for name in rest:   # second round, in the same order, while it fits
        if not fits():
            break
        run(name)
    if runs[-1][0] != base:   # the budget kept room for it
        run(base)
    (out / "variants.json").write_text(json.dumps({"variants": {n: VARIANTS[n] for n in names},
                                                   "baseline_src": a.baseline_src,
                                                   "runs": [[n, p.name] for n, p in runs]}, indent=1) + "\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
