"""The GDN GPU measurements in one device call, each step in its own process under a share of one time budget
(a step cut short keeps what it wrote; the next still runs), everything under ``--out``, a short table last:

1. ``bench.probes.gdn_decode_sm90`` at N=128, float32, bfloat16 and float16 pools: the sm_90 decode, its
   shared-memory variants (``DECODE_VARIANTS``), today's kernel, FLA, vLLM and the copy, then the checks against
   the float64 reference (``sm90/``);
2. the ``gdn/spec-decode-gpu`` bench (``python -m bench``; ``spec/perf.json`` and ``gates.json``);
3. ``bench.probes.gdn_chunked_stages`` at 1x8192 and 4x2048, bfloat16 then float32 pools: ours whole and by
   stage, FLA and vLLM in CUDA graphs and eager, the ceilings (``chunked/``);
4. ``bench.probes.gdn_chunked_kernels``: ncu's counters of each kernel of one chunked prefill, ours and FLA's,
   at 1x8192 and 4x2048 with bfloat16 pools (``kernels/``).

Each step's output goes to ``<step>.log``. On a GPU:

    python -m bench.probes.gdn_gpu_suite --out DIR [--budget SECONDS] [--steps NAME ...] [--commit SHA]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DECODE_SHAPES = ("N=128,state=float32", "N=128,state=bfloat16", "N=128,state=float16")
# the shared-memory variants of the sm_90 decode (the register-tile ones were timed before: none beat the default)
DECODE_VARIANTS = ("staged", "ring2-p", "ring3-p", "ring2-p-r168")
CHUNKED_SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
                  "varlen=4x2048,state=float32")
# (name, module arguments with OUT for the step's folder, the most seconds it may take)
STEPS = (
    ("sm90", ["bench.probes.gdn_decode_sm90", "--out", "OUT", "--shapes", *DECODE_SHAPES, "--variants",
              *DECODE_VARIANTS], 160),
    ("spec", ["bench", "--bench", "gdn/spec-decode-gpu", "--out", "OUT/perf.json", "--no-remeasure"], 110),
    ("chunked", ["bench.probes.gdn_chunked_stages", "--out", "OUT", "--shapes", *CHUNKED_SHAPES, "--commit", "COMMIT"],
     600),
    ("kernels", ["bench.probes.gdn_chunked_kernels", "--out", "OUT"], 300),
)
RESERVE_S = 10      # left at the end for the table


def run_step(name: str, args: list[str], out: Path, limit: float, commit: str) -> str:
    """``python -m args`` (OUT replaced by ``out / name``, COMMIT by ``commit``) under ``limit`` seconds, its output
    in ``out / (name + ".log")``; returns how it ended."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", *[a.replace("OUT", str(folder)).replace("COMMIT", commit) for a in args]]
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=limit).returncode
            how = f"rc {rc}"
        except subprocess.TimeoutExpired:
            how = f"stopped at its limit of {limit:.0f} s"
    return f"{name}: {how} after {time.monotonic() - t0:.0f} s"


def _records(path: Path) -> dict:
    """rid -> extra_info of a perf JSON (top level or under "perf"); {} when absent or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    doc = doc.get("perf", doc)
    return {b["name"]: b["extra_info"] for b in doc.get("benchmarks", [])}


def _by_shape(records: dict) -> dict:
    shapes: dict = {}
    for rid, info in records.items():
        bench_shape, impl = rid.rsplit("/", 1)
        shapes.setdefault(bench_shape, {})[impl] = info
    return shapes


def _ms(info: dict) -> float:
    return info["time_s"]["median"] * 1e3


def kernel_lines(path: Path) -> list[str]:
    """Per shape and implementation of ``gdn_chunked_kernels.json``: the kernels' ncu time in all and each
    kernel's, us, in launch order."""
    from bench.probes.gdn_chunked_kernels import total_us

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [f"{shape} {impl} under ncu: {total_us(rows):.1f} us = "
            + " + ".join(f"{r['kernel'][:32]} {r.get('gpu__time_duration.sum', 0.0):.1f}" for r in rows)
            for shape, impls in doc.items() for impl, rows in impls.items()]


def table(out: Path) -> list[str]:
    """One line per shape: each implementation's median ms, with its % of the in-run copy (decode, spec) or its
    time over FLA's in a graph (chunked); the sm_90 checks' pass counts."""
    lines = []
    for name, path in (("sm90", out / "sm90" / "gdn_decode_sm90.json"), ("spec", out / "spec" / "perf.json")):
        for shape, impls in _by_shape(_records(path)).items():
            cells = [f"{impl} {_ms(i):.4f}" + (f" ({100 * i['fraction_of']['gpu-copy']:.1f}%)"
                                                if i["role"] != "ceiling" and "gpu-copy" in i["fraction_of"] else "")
                     for impl, i in impls.items()]
            lines.append(f"{shape}: " + ", ".join(cells))
    for shape, impls in _by_shape(_records(out / "chunked" / "gdn_chunked_gpu.json")).items():
        fla = impls.get("fla")
        cells = [f"{impl} {_ms(i):.4f}" + (f" ({_ms(i) / _ms(fla):.2f}x fla)"
                                            if fla and impl in ("triton-gdn", "fla-eager", "vllm-gdn",
                                                                "vllm-gdn-eager") else "")
                 for impl, i in impls.items()]
        lines.append(f"{shape}: " + ", ".join(cells))
    lines += kernel_lines(out / "kernels" / "gdn_chunked_kernels.json")
    try:
        checks = json.loads((out / "sm90" / "gdn_decode_sm90.json").read_text()).get("checks", [])
    except (OSError, ValueError):
        checks = []
    kernels = sorted({k for row in checks for k, v in row.items() if isinstance(v, dict) and "ok" in v})
    if checks:
        lines.append("sm90 checks (cases passed): " + ", ".join(
            f"{k} {sum(bool(row.get(k, {}).get('ok')) for row in checks)}/{len(checks)}" for k in kernels))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for every step together (default 450)")
    ap.add_argument("--steps", nargs="*", default=[s[0] for s in STEPS], choices=[s[0] for s in STEPS])
    ap.add_argument("--commit", default="unknown", help="the commit measured (recorded by the chunked step)")
    args = ap.parse_args(argv)
    if args.budget <= RESERVE_S:
        ap.error(f"--budget: expected more than {RESERVE_S} seconds, got {args.budget}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget - RESERVE_S
    ended = []
    for name, step_args, cap in STEPS:
        if name not in args.steps:
            continue
        left = deadline - time.monotonic()
        if left < 5:
            ended.append(f"{name}: not run (the budget was spent)")
            continue
        ended.append(run_step(name, step_args, out, min(cap, left), args.commit))
        print(ended[-1], flush=True)
    lines = ended + table(out)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
