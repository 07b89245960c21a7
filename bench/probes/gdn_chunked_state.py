"""The GPU chunked prefill's state pass (``optimized.triton.gdn_chunked.stages``' "state") against another
version of the module (``--baseline PATH``, e.g. an older ``gdn_chunked.py``) and ours at another V-tile
(``VERSIONS``) at the ``gdn/chunked-gpu`` shapes, FLA's ``chunk_gated_delta_rule`` in a CUDA graph in the same
run. Per shape: each version run once from the same pool, its output and pool compared with the baseline's bit
for bit ("bitwise", or max |diff| over max |x|); then CUDA-graph samples (ms: the median of ``SAMPLES``, min and
max kept) of the stages before the state pass, the state pass alone and the whole prefill. With ``--ncu``,
instead, ncu's counters of one state pass of the baseline and ours at each shape (the third launch;
``NCU_METRICS``: duration, instructions, DRAM bytes and throughput, L2 hit rate, grid, waves and the occupancy
limits), each in a process of its own (``--ncu-target``). Each step catches its failure, prints it whole and
goes on. Writes ``gdn_chunked_state.json`` (or ``gdn_chunked_state_ncu.json`` and one ncu CSV a run); the table
is printed last:

    python -m bench.probes.gdn_chunked_state --out DIR --baseline PATH [--shapes LABEL ...] [--ncu]
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from bench.probes.common import find_ncu, measure_rows, ncu_metrics
from bench.probes.gdn_chunked_prep import _pre_state, fla_rows, ms_cell, spread_lines, timing_step
from bench.probes.gdn_chunked_variants import _diff, _load, _staged

SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
          "varlen=4x2048,state=float32")
NCU_SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16")
NCU_METRICS = ("gpu__time_duration.sum", "smsp__inst_executed.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
               "launch__grid_size", "launch__waves_per_multiprocessor", "launch__registers_per_thread",
               "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_registers",
               "sm__warps_active.avg.pct_of_peak_sustained_active")
# name: (the module, "baseline" or "ours"; ``stages`` keywords beside its defaults); "ours v64" (two V-tiles of 64
# columns a value head) halves the programs of the state pass: fewer waves where the grid is more than one
VERSIONS = {"baseline": ("baseline", {}), "ours": ("ours", {}),
            "ours v64": ("ours", dict(state_block_v=64, state_warps=8, state_stages=2))}


def _modules(baseline: str) -> dict:
    from optimized.triton import gdn_chunked

    return {"baseline": _load(baseline), "ours": gdn_chunked}


def _versions(baseline: str) -> dict:
    """{name: (module, stages keywords)} of ``VERSIONS``."""
    modules = _modules(baseline)
    return {name: (modules[module], config) for name, (module, config) in VERSIONS.items()}


def _inputs(label: str) -> dict:
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH, chunked_inputs

    return chunked_inputs(registry.benches()[CHUNKED_BENCH].shapes[label])


def measure(labels: list, versions: dict, rows: list, save) -> None:
    """Append (shape label, version, quantity, value, [min, max] or None) rows to ``rows`` as they are measured
    (a timing's value: its median, ms): FLA at every shape, then per shape the check and the timings of each
    version; ``save()`` after each shape."""
    import torch

    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    shapes = registry.benches()[CHUNKED_BENCH].shapes

    step = timing_step(rows, 9)
    inputs = {label: _inputs(label) for label in labels}
    fla_rows(step, shapes, inputs)
    for label, x in inputs.items():
        runs = {}
        for name, (module, config) in versions.items():
            try:
                pool = x["state"].clone()
                out, whole, launches = _staged(module, x, pool, **config)
                runs[name] = (out.clone(), pool.clone(), whole, launches)
            except Exception:
                print(f"{label} {name}: FAILED\n{traceback.format_exc()}", flush=True)
                rows.append((label, name, "check", "failed", None))
        for name, (o, p, *_) in runs.items():
            if name != "baseline" and "baseline" in runs:
                ob, pb = runs["baseline"][:2]
                same = "bitwise" if torch.equal(o, ob) and torch.equal(p, pb) else f"{_diff(o, ob)} / {_diff(p, pb)}"
                rows.append((label, name, "check", same, None))
                print(f"{label:30} {name:9} {'check':10} {same}", flush=True)
        for name, (_, _, whole, launches) in runs.items():
            step(label, name, "pre-state", lambda: _pre_state(launches))
            step(label, name, "state", lambda: launches["state"])
            step(label, name, "whole", lambda: whole)
        save()


def ncu_target(baseline: str, version: str, label: str) -> int:
    """Every stage of ``version`` once at shape ``label``, then the state pass twice (ncu takes its third)."""
    import torch

    x = _inputs(label)
    module, config = _versions(baseline)[version]
    _, _, launches = _staged(module, x, x["state"].clone(), **config)
    for _ in range(2):
        launches["state"]()
    torch.cuda.synchronize()
    return 0


def ncu(out: Path, baseline: str, labels: list) -> dict:
    """ncu's ``NCU_METRICS`` of the third state pass of the baseline and ours at each shape of ``labels``:
    {label: {version: {metric: (value, unit)}}}; each run's CSV kept under ``out``."""
    exe = find_ncu()
    if exe is None:
        return {}
    result = {}
    for label in labels:
        for version in ("baseline", "ours"):
            target = ["bench.probes.gdn_chunked_state", "--out", str(out), "--baseline", baseline,
                      "--ncu-target", version, label]
            tag = f"{version}_{label}".replace("=", "").replace(",", "_").replace(" ", "_")
            try:
                metrics = ncu_metrics(exe, "_state_kernel", NCU_METRICS, target, out / f"ncu_state_{tag}.csv",
                                      f"{label} {version}", 60)
                result.setdefault(label, {})[version] = metrics
                if metrics:
                    print(f"ncu {label} {version}: " + ", ".join(f"{k}={v[0]}" for k, v in metrics.items()),
                          flush=True)
            except Exception as exc:
                print(f"ncu {label} {version}: {type(exc).__name__}: {exc}"[:500], flush=True)
    return result


def table(rows: list, labels: list) -> list[str]:
    """One line per shape and version: pre-state, state pass and whole (ms), the whole over FLA's, the check."""
    value = {(label, name, q): v for label, name, q, v, _ in rows}
    lines = [f"{'shape':30} {'version':9} {'pre-state':>9} {'state':>9} {'whole':>9} {'/FLA':>6}  check"]
    for label in labels:
        fla = value.get((label, "fla", "whole"))
        lines.append(f"{label:30} {'fla':9} {'':>9} {'':>9} {ms_cell(fla)}")
        for name in VERSIONS:
            whole = value.get((label, name, "whole"))
            ratio = f"{whole / fla:5.2f}x" if isinstance(whole, float) and isinstance(fla, float) else f"{'-':>6}"
            lines.append(f"{label:30} {name:9} {ms_cell(value.get((label, name, 'pre-state')))} "
                         f"{ms_cell(value.get((label, name, 'state')))} {ms_cell(whole)} {ratio}  "
                         f"{value.get((label, name, 'check'), '')}")
    return lines + spread_lines(rows)


def ncu_table(result: dict) -> list[str]:
    short = {"gpu__time_duration.sum": "us", "smsp__inst_executed.sum": "warp instr",
             "dram__bytes_read.sum": "DRAM read", "dram__bytes_write.sum": "DRAM write",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %", "lts__t_sector_hit_rate.pct": "L2 hit %",
             "launch__grid_size": "grid", "launch__waves_per_multiprocessor": "waves",
             "launch__registers_per_thread": "regs", "launch__occupancy_limit_shared_mem": "smem limit",
             "launch__occupancy_limit_registers": "reg limit",
             "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active %"}
    lines = ["ncu, the state pass, one launch (--clock-control none):"]
    for label, versions in result.items():
        for version, metrics in versions.items():
            lines.append(f"  {label:30} {version:9} " + ", ".join(
                f"{short.get(k, k)} {v} {u}".rstrip() for k, (v, u) in metrics.items()))
    return lines


def main(argv=None) -> int:
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", required=True, help="another gdn_chunked.py, compared and timed beside this one")
    ap.add_argument("--shapes", nargs="*", default=None,
                    help=f"shape labels of gdn/chunked-gpu (default {SHAPES}; with --ncu {NCU_SHAPES})")
    ap.add_argument("--ncu", action="store_true", help="ncu's counters of the state pass instead of the timings")
    ap.add_argument("--ncu-target", nargs=2, metavar=("VERSION", "LABEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    registry.load()
    shapes = registry.benches()[CHUNKED_BENCH].shapes
    labels = args.shapes if args.shapes is not None else list(NCU_SHAPES if args.ncu else SHAPES)
    bad = [label for label in labels + ([args.ncu_target[1]] if args.ncu_target else []) if label not in shapes]
    if bad:
        print(f"--shapes: unknown {bad}; expected labels of {sorted(shapes)}")
        return 2
    if args.ncu_target:
        if args.ncu_target[0] not in VERSIONS:
            print(f"--ncu-target: expected a version of {list(VERSIONS)}, got {args.ncu_target[0]!r}")
            return 2
        return ncu_target(args.baseline, *args.ncu_target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.ncu:
        result = ncu(out, args.baseline, labels)
        (out / "gdn_chunked_state_ncu.json").write_text(json.dumps(result, indent=1) + "\n")
        print()
        for line in ncu_table(result):
            print(line)
        return 0
    rows = []

    def run(save):
        measure(labels, _versions(args.baseline), rows, save)

    measure_rows(out / "gdn_chunked_state.json", rows, run)
    print()
    for line in table(rows, labels):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
