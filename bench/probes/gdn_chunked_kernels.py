"""Where one GPU chunked prefill spends its time, kernel by kernel, ours beside FLA's: ncu's counters
(``NCU_METRICS``) of every kernel that one call launches, for the registry's ``triton-gdn`` (our launcher) and
``fla`` (``chunk_gated_delta_rule``) of ``gdn/chunked-gpu`` at its shapes. Each call is the third of a process of
its own (``--target``), between ``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu ``--profile-from-start off
--clock-control none``, which runs the kernels one at a time: launch gaps are not counted). Prints per shape and
implementation one line per kernel (us, share of the call, DRAM MB read + written and % of peak throughput, SM
throughput %, warp instructions, registers a thread, warps active %, grid, waves) and the sum; writes
``gdn_chunked_kernels.json`` and one ncu CSV a run (``--from-csv`` rebuilds both from an earlier run's CSVs).
Our eager call includes the launcher's value checks (``_nonfinite_kernel``, ``_decay_kernel`` and torch's small
kernels), which the bench's CUDA graph leaves out:

    python -m bench.probes.gdn_chunked_kernels --out DIR [--shapes LABEL ...] [--impls NAME ...]   (a GPU, ncu)
    python -m bench.probes.gdn_chunked_kernels --out DIR --from-csv     (the CSVs already in DIR; no GPU)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.probes.common import find_ncu, ncu_csv_rows, ncu_kernels, ncu_range

SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16")
IMPLS = ("triton-gdn", "fla")
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "smsp__inst_executed.sum", "launch__registers_per_thread",
               "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size",
               "launch__waves_per_multiprocessor")
# ncu prints a value in a unit of its choice: these bring times to us and bytes to MB
_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
          "second": 1e6, "byte": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0, "Gbyte": 1e3, "GB": 1e3}
TIMEOUT_S = 240


def _number(value: str, unit: str) -> float:
    """ncu's printed ``value`` (thousands separators allowed) in us, MB or as printed."""
    return float(value.replace(",", "")) * _SCALE.get(unit, 1.0)


def target(impl: str, label: str) -> int:
    """Three calls of ``impl`` at shape ``label``, the third between cudaProfilerStart and cudaProfilerStop."""
    import torch

    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    bench = registry.benches()[CHUNKED_BENCH]
    shape = bench.shapes[label]
    call = registry.impls(bench.name)[impl].prepare(shape, bench.inputs(shape))
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


def _csv_path(out: Path, impl: str, label: str) -> Path:
    return out / ("ncu_" + f"{impl}_{label}".replace("=", "").replace(",", "_") + ".csv")


def _numbers(found: list) -> list[dict]:
    return [{"kernel": name, **{m: _number(*vu) for m, vu in metrics.items()}} for name, metrics in found]


def kernels(out: Path, impl: str, label: str, from_csv: bool = False) -> list[dict]:
    """ncu's counters of each kernel of one call: [{"kernel": name, metric: number}] in launch order; with
    ``from_csv``, read from the CSV an earlier run left in ``out`` ([] where there is none)."""
    path = _csv_path(out, impl, label)
    if from_csv:
        return _numbers(ncu_kernels(ncu_csv_rows(path.read_text()))) if path.exists() else []
    exe = find_ncu()
    if exe is None:
        return []
    return _numbers(ncu_range(exe, NCU_METRICS, ["bench.probes.gdn_chunked_kernels", "--target", impl, label], path,
                              f"{label} {impl}", TIMEOUT_S))


def total_us(rows: list[dict]) -> float:
    """The kernels' ncu time in all, us."""
    return sum(r.get("gpu__time_duration.sum", 0.0) for r in rows)


def table(label: str, impl: str, rows: list[dict]) -> list[str]:
    total = total_us(rows)
    lines = [f"{label} {impl}: {len(rows)} kernels, {total:.1f} us (ncu, one at a time)",
             f"  {'kernel':44} {'us':>8} {'share':>6} {'DRAM MB':>8} {'DRAM%':>6} {'SM%':>6} {'inst M':>8} "
             f"{'regs':>5} {'warps%':>6} {'grid':>7} {'waves':>6}"]
    for r in rows:
        t = r.get("gpu__time_duration.sum", 0.0)
        mb = r.get("dram__bytes_read.sum", 0.0) + r.get("dram__bytes_write.sum", 0.0)
        lines.append(
            f"  {r['kernel'][:44]:44} {t:8.1f} {100 * t / total if total else 0:5.1f}% {mb:8.1f} "
            f"{r.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', 0):6.1f} "
            f"{r.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', 0):6.1f} "
            f"{r.get('smsp__inst_executed.sum', 0) / 1e6:8.2f} {r.get('launch__registers_per_thread', 0):5.0f} "
            f"{r.get('sm__warps_active.avg.pct_of_peak_sustained_active', 0):6.1f} "
            f"{r.get('launch__grid_size', 0):7.0f} {r.get('launch__waves_per_multiprocessor', 0):6.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for gdn_chunked_kernels.json and the ncu CSVs")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="gdn/chunked-gpu shape labels")
    ap.add_argument("--impls", nargs="*", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--from-csv", action="store_true", help="read the ncu CSVs already in --out instead of profiling")
    ap.add_argument("--target", nargs=2, metavar=("IMPL", "LABEL"), help="(internal) the process ncu profiles")
    args = ap.parse_args(argv)
    if args.target:
        return target(*args.target)
    if not args.out:
        ap.error("--out: expected a folder")
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    known = registry.benches()[CHUNKED_BENCH].shapes
    bad = [s for s in args.shapes if s not in known]
    if bad:
        ap.error(f"--shapes: expected labels of {CHUNKED_BENCH} ({', '.join(known)}), got {', '.join(bad)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    for label in args.shapes:
        for impl in args.impls:
            try:
                rows = kernels(out, impl, label, args.from_csv)
            except subprocess.TimeoutExpired:
                rows = []
                print(f"{label} {impl}: ncu did not end within {TIMEOUT_S} s", flush=True)
            result.setdefault(label, {})[impl] = rows
            (out / "gdn_chunked_kernels.json").write_text(json.dumps(result, indent=1) + "\n")
            print("\n".join(table(label, impl, rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
