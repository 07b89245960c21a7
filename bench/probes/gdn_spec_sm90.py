"""The GDN speculative verify on an sm_90 GPU in one call: checks, timings, ncu, a short table last.

Steps (each catches its failure, prints it and goes on; everything under ``--out``):

1. ``agree``: the sm_90 spec decode (``gdn_decode_sm90.spec_decode``, its default and each of ``VARIANTS``)
   against today's portable kernel (``gdn_recurrent.spec_decode``) on the ``gdn/spec-decode-gpu`` inputs at N=32,
   T=2 and 4, every pool dtype, both from the same pool: the largest difference of o and of the stored states
   (relative to the largest magnitude) and the fraction of state elements that differ (both kernels round each
   stored state once, summing over K in another order: a 16-bit pool's few one-ulp flips, at most 5% of the
   elements, nothing near 1e-2 relative, is agreement);
2. ``conform``: ``kernel-lab conform --tier ci --family gdn --op spec_decode`` on ``triton-gdn-sm90`` and
   ``triton-gdn`` (the dispatcher: on sm_90 the K = V = 128 cells go to the sm_90 kernel), then the full tier's
   K=128 spec_decode cells of ``triton-gdn-sm90`` under ``--full-budget``, then
   ``tests/unit/test_triton_gdn_gpu.py`` (no allocation per call, CUDA-graph replay);
3. ``time``: the ``gdn/spec-decode-gpu`` shapes (T = 2, 4; N = 32, 128; float32, bfloat16, float16 pools),
   today's kernel at its default launch (``portable``), the sm_90 spec decode at its default (V block from N HV
   and the multiprocessors) and ``VARIANTS``, and the fan-out copy of the op's bytes, each a CUDA graph timed by
   ``bench.timing.cuda_graph`` (``--reps`` samples, each the median of ``REP_MS`` of replays): ms min / median /
   max and the median's fraction of the copy's rate;
4. ``ncu``: one N=32, T=4, bfloat16 launch of each kernel at its default (the third), instructions, achieved
   occupancy, DRAM throughput, waves, registers, duration.

    python -m bench.probes.gdn_spec_sm90 --out DIR [--steps agree conform time ncu] [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from bench.probes.common import find_ncu, ncu_metrics

DTYPES = ("float32", "bfloat16", "float16")
# sm_90 spec decode tile variants (``gdn_decode_sm90.spec_config``); "portable-bv16": today's kernel at V block 16
VARIANTS = {"sm90-bv128": dict(block_v=128), "sm90-bv64": dict(block_v=64), "sm90-bv32": dict(block_v=32),
            "sm90-l16-bv64": dict(lanes_k=16, block_v=64), "sm90-l16-bv32": dict(lanes_k=16, block_v=32)}
PORTABLE_VARIANTS = {"portable-bv16": dict(block_v=16)}
NCU_SHAPE = "T=4,N=32,state=bfloat16"
REP_MS = 40             # ms of replays a sample (70 to 1000 replays at these sizes): the call stays near 3 minutes
NCU_METRICS = ("gpu__time_duration.sum", "smsp__inst_executed.sum", "sm__warps_active.avg.pct_of_peak_sustained_active",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__waves_per_multiprocessor",
               "launch__registers_per_thread", "launch__grid_size", "launch__block_size", "dram__bytes_read.sum",
               "dram__bytes_write.sum", "launch__occupancy_limit_registers")
KERNELS = {"portable": "_gdn_kernel", "sm90": "_spec_kernel"}


def _call(kernel: str, x: dict, out, ws, **config):
    from optimized.triton import gdn_decode_sm90, gdn_recurrent

    fn = gdn_recurrent.spec_decode if kernel == "portable" else gdn_decode_sm90.spec_decode
    return lambda: fn(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], x["state"],
                      x["spec_state_indices"], x["num_accepted_tokens"], x["cu_seqlens"], out=out, workspace=ws,
                      **config)


def _impls() -> dict:
    """name -> (kernel, config): today's default first, then the sm_90 default, then the variants."""
    return {"portable": ("portable", {}), **{n: ("portable", c) for n, c in PORTABLE_VARIANTS.items()},
            "sm90": ("sm90", {}), **{n: ("sm90", c) for n, c in VARIANTS.items()}}


# ---------------------------------------------------------------- 1. agreement with today's kernel

def agree(out: Path) -> list[dict]:
    import torch

    from bench.gdn_gpu import SPEC_SHAPES, spec_inputs
    from optimized.triton.gdn_recurrent import Workspace

    rows = []
    for T in (2, 4):
        for dtype in DTYPES:
            label = f"T={T},N=32,state={dtype}"
            x = spec_inputs(SPEC_SHAPES[label])
            pool0 = x["state"].clone()
            ws = Workspace("cuda")
            o_ref = torch.empty_like(x["v"])
            _call("portable", x, o_ref, ws)()
            S_ref = x["state"].float().clone()
            for name, (kernel, config) in _impls().items():
                if name == "portable":
                    continue
                row = {"shape": label, "impl": name}
                try:
                    x["state"].copy_(pool0)
                    o = torch.full_like(x["v"], float("nan"))
                    _call(kernel, x, o, ws, **config)()
                    torch.cuda.synchronize()
                    S = x["state"].float()
                    o_scale = o_ref.float().abs().max().item()
                    s_scale = S_ref.abs().max().item()
                    row.update(o_rel=(o.float() - o_ref.float()).abs().max().item() / o_scale,
                               s_rel=(S - S_ref).abs().max().item() / s_scale,
                               s_differ=(S != S_ref).float().mean().item(), o_nan=bool(torch.isnan(o).any()))
                    row["agree"] = (not row["o_nan"] and row["o_rel"] <= 1e-2 and row["s_rel"] <= 1e-2
                                    and (dtype == "float32" or row["s_differ"] <= 0.05))
                except Exception as exc:  # reported per row: one failure does not hide the others
                    row.update(agree=False, error=f"{type(exc).__name__}: {exc}"[:500])
                print("agree", json.dumps(row), flush=True)
                rows.append(row)
            x["state"].copy_(pool0)
    (out / "agree.json").write_text(json.dumps(rows, indent=1))
    return rows


# ---------------------------------------------------------------- 2. conformance cells

def _counts(folder: Path) -> dict:
    counts = {}
    path = folder / "cells.jsonl"
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        r = json.loads(line)
        c = counts.setdefault(r["backend"], {})
        c[r["status"]] = c.get(r["status"], 0) + 1
        if r["status"] not in ("pass", "skip", "xfail"):
            print("not pass:", r["backend"], r["id"], r["status"], str(r.get("reason"))[:300], flush=True)
    return counts


def conform(out: Path, full_budget: str) -> dict:
    runs = {"ci": ["--tier", "ci", "--backend", "triton-gdn-sm90,triton-gdn"],
            "full-K128": ["--tier", "full", "--filter", "K=128", "--backend", "triton-gdn-sm90", "--budget",
                          full_budget]}
    result = {}
    for name, args in runs.items():
        folder = out / f"conform-{name}"
        argv = [sys.executable, "-m", "kernel_lab", "conform", "--family", "gdn", "--op", "spec_decode", *args,
                "--out", str(folder), "--allow-nothing-ran"]
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=150)
            print(p.stdout[-2500:], p.stderr[-1500:], flush=True)
            how = f"rc {p.returncode}"
        except Exception as exc:
            how = f"{type(exc).__name__}: {exc}"[:300]
            print(f"conform {name}: {how}", flush=True)
        result[name] = {"how": how, "seconds": round(time.monotonic() - t0, 1), "counts": _counts(folder)}
    t0 = time.monotonic()
    try:  # no allocation per call, CUDA-graph replay equal to an eager call, for decode and both spec kernels
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/unit/test_triton_gdn_gpu.py"], capture_output=True, text=True, timeout=120)
        print(p.stdout[-2500:], p.stderr[-1000:], flush=True)
        tail = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        how = f"rc {p.returncode}: {tail}"
    except Exception as exc:
        how = f"{type(exc).__name__}: {exc}"[:300]
    result["gpu-tests"] = {"how": how, "seconds": round(time.monotonic() - t0, 1), "counts": {}}
    (out / "conform.json").write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------- 3. timings

def timings(out: Path, reps: int) -> dict:
    import torch

    from bench import gpu_ceilings
    from bench.gdn_gpu import SPEC_SHAPES, _fanout_bytes, _fanout_cost, spec_inputs
    from bench.timing import cuda_graph, summary
    from conformance.families.gdn import cost
    from optimized.triton.gdn_recurrent import Workspace

    records = {}
    for label, shape in SPEC_SHAPES.items():
        rec = records.setdefault(label, {})
        try:
            x = spec_inputs(shape)
            ws = Workspace("cuda")
            o = torch.empty_like(x["v"])
            copy = cuda_graph(gpu_ceilings.triton_fanout(_fanout_bytes(shape), shape["T"]), reps, REP_MS, 10)
            rec["copy"] = {**summary(copy), "GBps": _fanout_cost(shape).bytes / np.median(copy) / 1e9}
            op_bytes = cost.spec_decode(shape).bytes
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print("time", label, rec["error"], flush=True)
            continue
        for name, (kernel, config) in _impls().items():
            try:
                t = cuda_graph(_call(kernel, x, o, ws, **config), reps, REP_MS, 10)
                rec[name] = {**summary(t), "of_copy": op_bytes / np.median(t) / 1e9 / rec["copy"]["GBps"]}
            except Exception as exc:
                rec[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print("time", label, name, json.dumps(rec[name]), flush=True)
        del x
        torch.cuda.empty_cache()
        (out / "time.json").write_text(json.dumps(records, indent=1))
    return records


# ---------------------------------------------------------------- 4. ncu

def ncu_target(kernel: str) -> int:
    """Three spec decodes of ``kernel`` ("portable" or "sm90") at ``NCU_SHAPE`` (ncu takes the third)."""
    import torch

    from bench.gdn_gpu import SPEC_SHAPES, spec_inputs
    from optimized.triton.gdn_recurrent import Workspace

    x = spec_inputs(SPEC_SHAPES[NCU_SHAPE])
    fn = _call(kernel, x, torch.empty_like(x["v"]), Workspace("cuda"))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return 0


def ncu(out: Path) -> dict:
    exe = find_ncu()
    if exe is None:
        return {}
    result = {}
    for kernel, regex in KERNELS.items():
        try:
            target = ["bench.probes.gdn_spec_sm90", "--ncu-target", kernel]
            result[kernel] = ncu_metrics(exe, regex, NCU_METRICS, target, out / f"ncu_{kernel}.csv", kernel, 120)
        except Exception as exc:
            print(f"ncu {kernel}: {type(exc).__name__}: {exc}"[:500], flush=True)
    (out / "ncu.json").write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------- the table

def table(results: dict) -> str:
    lines = []
    rows = results.get("agree") or []
    if rows:
        bad = [r for r in rows if not r.get("agree")]
        lines.append(f"agree with today's kernel: {len(rows) - len(bad)}/{len(rows)}"
                     + "".join(f"\n  NOT {r['shape']} {r['impl']}: {r.get('error') or r}" for r in bad))
        lines.append("  worst o_rel %.2e, s_rel %.2e, s_differ %.4f" % (
            max(r.get("o_rel", 0) for r in rows), max(r.get("s_rel", 0) for r in rows),
            max(r.get("s_differ", 0) for r in rows)))
    for name, run in (results.get("conform") or {}).items():
        lines.append(f"conform {name} ({run['how']}, {run['seconds']} s): " + "; ".join(
            f"{b} " + " ".join(f"{s}={n}" for s, n in sorted(c.items())) for b, c in sorted(run["counts"].items())))
    recs = results.get("time") or {}
    if recs:
        names = list(_impls())
        lines.append("gdn/spec-decode-gpu, ms median (min-max) and % of the in-run fan-out copy:")
        lines.append("| shape | copy ms | " + " | ".join(names) + " |")
        lines.append("|---" * (len(names) + 2) + "|")
        for label, rec in recs.items():
            if "copy" not in rec:
                lines.append(f"| {label} | {rec.get('error', '?')} |")
                continue
            cells = []
            for n in names:
                r = rec.get(n, {})
                cells.append(r["error"][:40] if "error" in r else "-" if not r else
                             "%.4f (%.4f-%.4f) %.1f%%" % (r["median"] * 1e3, r["min"] * 1e3, r["max"] * 1e3,
                                                          100 * r["of_copy"]))
            lines.append(f"| {label} | {rec['copy']['median'] * 1e3:.4f} | " + " | ".join(cells) + " |")
    nc = results.get("ncu") or {}
    if nc:
        lines.append(f"ncu, {NCU_SHAPE}, one launch (cold caches):")
        for kernel, m in nc.items():
            lines.append(f"  {kernel}: " + ", ".join(f"{k.split('__')[-1]}={v[0]} {v[1]}".strip()
                                                     for k, v in m.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="spec-out")
    ap.add_argument("--steps", nargs="*", default=["agree", "conform", "time", "ncu"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--full-budget", default="30s")
    ap.add_argument("--ncu-target", choices=tuple(KERNELS))
    args = ap.parse_args(argv)
    if args.ncu_target:
        return ncu_target(args.ncu_target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import optimized
    import triton
    import torch

    print(f"optimized from {Path(optimized.__file__).parent}, triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}", flush=True)
    results = {}
    steps = {"agree": lambda: agree(out), "conform": lambda: conform(out, args.full_budget),
             "time": lambda: timings(out, args.reps), "ncu": lambda: ncu(out)}
    for name in args.steps:
        t0 = time.monotonic()
        try:
            results[name] = steps[name]()
        except Exception:
            print(f"step {name} failed:\n{traceback.format_exc()}", flush=True)
        print(f"step {name}: {time.monotonic() - t0:.1f} s", flush=True)
    text = table(results)
    (out / "table.md").write_text(text + "\n")
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
