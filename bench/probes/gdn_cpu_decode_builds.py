"""Builds of the C++ GDN decode from several source trees, side by side in the registry's ``gdn/decode``
bench and in ``bench.probes.gdn_decode_cached``
(``python3 -m bench.probes.gdn_cpu_decode_builds --out DIR --run NAME=TREE[:PLAN] ...``).

A tree is a folder with this repository's ``CMakeLists.txt`` and ``optimized/`` (e.g. another
commit's, from ``git archive COMMIT CMakeLists.txt optimized | tar -x -C TREE``; ``.`` is this
checkout). Every tree named by a run is built once with CMake and Ninja into
``build/decode-builds/<tree>`` (in parallel; the module not copied next to its sources). Each run then
takes the whole bench in its own process: its tree's ``optimized`` package first on ``PYTHONPATH``
(this checkout's ``bench``, ``conformance``, ``reference`` after it), the tree's module through
``KERNEL_LAB_GDN_MODULE``, the decode plan ``PLAN`` (default ``pipelined``) through
``KERNEL_LAB_GDN_DECODE_PLAN``, pinned with ``taskset -c CPUS`` (default 0,1) and
``OMP_WAIT_POLICY=PASSIVE``, ``--no-remeasure`` (the bench's own 15 rounds). Order: every run in turn,
then again while the next round fits ``--budget`` (builds included), then each run's cached probe
(``--cached``, on the first CPU of ``CPUS`` for the cached part and on ``CPUS`` for the streamed part).

The table printed last, per run and state dtype over all its bench runs: the in-place stream's and the
decode's ms (medians of the rounds) and the fraction of the stream (decode GB/s over the stream's
GB/s, paired by round as the gates pair them) min / median / max, then the cached probe's us per item.
``DIR/decode_builds.json`` keeps the rows; each bench run's perf JSON is ``DIR/NN-NAME/perf.json``.
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
DTYPES = (("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("bfloat16/act=float16", "bf16/a16"))
PLANS = ("pipelined", "blocked", "blocked-keep", "columns")


def parse_run(spec: str) -> tuple[str, Path, str]:
    """NAME=TREE[:PLAN] -> (name, tree, plan)."""
    name, sep, rest = spec.partition("=")
    tree, _, plan = rest.partition(":")
    plan = plan or "pipelined"
    if not sep or not name or not tree:
        raise ValueError(f"--run {spec!r}: expected NAME=TREE[:PLAN]")
    if plan not in PLANS:
        raise ValueError(f"--run {spec!r}: plan expected one of {PLANS}, got {plan!r}")
    path = (ROOT / tree).resolve()
    if not (path / "CMakeLists.txt").is_file() or not (path / "optimized" / "cpu").is_dir():
        raise ValueError(f"--run {spec!r}: {path} has no CMakeLists.txt and optimized/cpu")
    return name, path, plan


def tree_key(path: Path) -> str:
    return "checkout" if path == ROOT else path.name


def env_of(so: Path, tree: Path, plan: str) -> dict:
    """The environment of a run; its processes start in the tree (``python -m`` puts the working
    folder first on sys.path, so the tree's ``optimized`` is the one imported)."""
    paths = [str(tree)] + ([str(ROOT)] if tree != ROOT else []) + [os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, KERNEL_LAB_GDN_MODULE=str(so), KERNEL_LAB_GDN_DECODE_PLAN=plan, OMP_WAIT_POLICY="PASSIVE",
                PYTHONPATH=os.pathsep.join(p for p in paths if p))


def bench_run(env: dict, tree: Path, out: Path, cpus: str) -> tuple[int, float]:
    """One registry bench run of gdn/decode: (exit status, seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(out / "bench.log", "w") as log:
        rc = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "bench", "--bench", "gdn/decode",
                             "--no-remeasure", "--out", str(out / "perf.json")],
                            cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - t0


def cached_run(env: dict, tree: Path, out: Path, cpus: str) -> dict | None:
    """The cached probe of one run (its JSON's per-dtype rows), or None if it failed."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cached.log", "w") as log:
        rc = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "bench.probes.gdn_decode_cached",
                             "--out", str(out)], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        print((out / "cached.log").read_text()[-2000:], file=sys.stderr)
        return None
    return json.loads((out / "gdn_decode_cached.json").read_text())["dtypes"]


def rounds(perf: dict, shape: str):
    """(stream seconds, decode seconds, fraction) per round of one shape of a perf JSON."""
    recs = {b["name"]: b for b in perf["benchmarks"]}
    s, o = recs.get(f"gdn/decode/state={shape}/cpu-rmw-stream"), recs.get(f"gdn/decode/state={shape}/cpu")
    if s is None or o is None:
        return None
    st, ot = np.array(s["stats"]["data"]), np.array(o["stats"]["data"])
    n = min(len(st), len(ot))
    frac = (o["extra_info"]["bytes"] / ot[:n]) / (s["extra_info"]["bytes"] / st[:n])
    return st[:n], ot[:n], frac


def _num(x: float | None, width: int) -> str:
    return f"{x:{width}.2f}" if x is not None else "-".rjust(width)


def table(runs: list[tuple[str, Path]], cached: dict) -> tuple[str, list[dict]]:
    order = list(dict.fromkeys(name for name, _ in runs))
    rows = []
    for name in order:
        perfs = [json.loads((p / "perf.json").read_text())
                 for n, p in runs if n == name and (p / "perf.json").is_file()]
        for shape, short in DTYPES:
            got = [r for r in (rounds(perf, shape) for perf in perfs) if r is not None]
            if not got:
                continue
            st, ot, fr = (np.concatenate([g[i] for g in got]) for i in range(3))
            c = (cached.get(name) or {}).get(shape) or {}
            rows.append({"run": name, "state": short, "bench_runs": len(got),
                         "stream_ms": float(np.median(st) * 1e3),
                         "decode_ms": float(np.median(ot) * 1e3), "fraction_min": float(fr.min()),
                         "fraction_median": float(np.median(fr)), "fraction_max": float(fr.max()),
                         "cached_us": c.get("cached_us"), "stream_us": c.get("stream_us"),
                         "decode_us": c.get("decode_us"), "overlap": c.get("overlap")})
    head = (f"{'run':12} {'state':8} {'runs':>4} {'stream ms':>9} {'decode ms':>9}  "
            f"{'fraction min / median / max':27}"
            f" {'cached':>6} {'stream':>6} {'decode':>6} {'overlap':>7}  (us per item and thread)")
    lines = [head] + [f"{r['run']:12} {r['state']:8} {r['bench_runs']:4d} {r['stream_ms']:9.2f} {r['decode_ms']:9.2f}  "
                      f"{r['fraction_min']:.3f} / {r['fraction_median']:.3f} / {r['fraction_max']:.3f}      "
                      f"{_num(r['cached_us'], 6)} {_num(r['stream_us'], 6)} {_num(r['decode_us'], 6)} "
                      f"{_num(r['overlap'], 7)}"
                      for r in rows]
    return "\n".join(lines), rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/out/decode-builds"), help="folder for the runs")
    ap.add_argument("--run", action="append", required=True, metavar="NAME=TREE[:PLAN]",
                    help="a run: its name, source tree (relative to the repository root) and decode plan")
    ap.add_argument("--build-root", default=str(ROOT / "build" / "decode-builds"))
    ap.add_argument("--cpus", default="0,1", help="taskset CPU list of the bench runs")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds for builds and bench rounds (a round starts only if it fits); cached probes follow")
    ap.add_argument("--no-cached", dest="cached", action="store_false", help="skip the cached probe")
    a = ap.parse_args(argv)
    try:
        specs = [parse_run(s) for s in a.run]
    except ValueError as exc:
        ap.error(str(exc))
    if len({n for n, _, _ in specs}) != len(specs):
        ap.error("--run: names must differ")
    print(f"{cpu_model()}, {os.cpu_count()} CPUs; bench runs pinned to {a.cpus}", flush=True)
    t0 = time.monotonic()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trees = list(dict.fromkeys(path for _, path, _ in specs))
    sos = build_modules({tree_key(t): t for t in trees}, Path(a.build_root).resolve())
    envs = {name: env_of(sos[tree_key(path)], path, plan) for name, path, plan in specs}
    tree_of = {name: path for name, path, _ in specs}
    runs: list[tuple[str, Path]] = []
    took: list[float] = []
    for rnd in range(100):
        if rnd and time.monotonic() - t0 + sum(took[-len(specs):]) > a.budget:
            break
        for name, _, _ in specs:
            path = out / f"{len(runs):02d}-{name}"
            rc, sec = bench_run(envs[name], tree_of[name], path, a.cpus)
            runs.append((name, path))
            took.append(sec)
            print(f"{path.name}: rc {rc} (a failed gate is 1), {sec:.0f} s, at {time.monotonic() - t0:.0f} s",
                  flush=True)
            if rc not in (0, 1):
                print((path / "bench.log").read_text()[-2000:], file=sys.stderr)
    cached = {}
    if a.cached:
        for name, _, _ in specs:
            cached[name] = cached_run(envs[name], tree_of[name], out / f"cached-{name}", a.cpus)
            print(f"cached probe {name}: at {time.monotonic() - t0:.0f} s", flush=True)
    text, rows = table(runs, cached)
    (out / "decode_builds.json").write_text(json.dumps(
        {"cpu": cpu_model(), "cpus": a.cpus, "runs": [[n, str(p), plan] for n, p, plan in specs], "rows": rows},
        indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
