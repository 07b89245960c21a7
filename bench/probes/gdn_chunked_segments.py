"""The GPU chunked prefill's segmented state pass (``optimized.triton.gdn_chunked.stages(segment_chunks=...)``)
beside the serial one at the ``gdn/chunked-gpu`` shapes (1 x 8192 and 4 x 2048 tokens, Qwen3-Next's heads, bf16
activations; bf16 and fp32 pools): per configuration (``CONFIGS``: segment_chunks 4, 8, 16; the state pass's
V-tile 32, 64, 128 and warps 4 or 8; the serial path at V-tiles 32, 64, 128), in a process of its own (an
illegal address kills a CUDA context: the other configurations keep theirs), per shape, the output and pool
against the serial path's from the same inputs (max |diff| and rel_l2), then CUDA-graph samples (ms: the median
of ``SAMPLES``, min and max kept) of the whole prefill, of the state-pass launches together (maps, merge and
state; serial: the state pass) and of each alone. Configurations run in ``CONFIGS``' order, the likeliest
first; past ``--budget`` seconds (counted from the start) the rest are skipped (``--configs`` splits them over
several device calls). Writes ``gdn_chunked_segments.json`` (the date, device and command with the results)
after each configuration; the table (configuration, shape, whole ms, state ms, o and pool rel_l2 against
serial) is printed last:

    python -m bench.probes.gdn_chunked_segments --out DIR [--configs NAME ...] [--budget S]   (on a GPU)
    TRITON_INTERPRET=1 python -m bench.probes.gdn_chunked_segments --out DIR --shapes test     (no GPU: the
        checks at small shapes through the interpreter, nothing timed)
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.probes.gdn_chunked_prep import _samples
from bench.probes.gdn_chunked_variants import _staged

GPU_SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
              "varlen=4x2048,state=float32")
# small shapes for the interpreter: sequences of 16 and 3 chunks (segment_chunks 4, 8, 16: 4, 2 and 1 segments)
TEST_SHAPES = {f"lens=1000+130,state={s}": dict(lens=[1000, 130], H=2, HV=4, K=32, V=32, state_dtype=s,
                                                act="bfloat16") for s in ("bfloat16", "float32")}
# name: ``stages`` keywords (the likeliest first: past the budget the rest is skipped); "s8 v64 w8": segments of
# 8 chunks, the state pass's V-tile 64 in 8 warps (2 pipeline stages above a V-tile of 32, else 3); "m128 mw8":
# the maps kernel's column tile 128 in 8 warps (default MAPS_BC, MAPS_WARPS)
CONFIGS = {"serial": {}, "serial v64 w8": dict(state_block_v=64, state_warps=8, state_stages=2),
           "serial v128 w8": dict(state_block_v=128, state_warps=8, state_stages=2)}
CONFIGS.update({f"s{seg} v{bv} w{w}": dict(segment_chunks=seg, state_block_v=bv, state_warps=w,
                                           state_stages=2 if bv > 32 else 3)
                for bv, w in ((64, 8), (128, 8), (64, 4), (128, 4), (32, 4), (32, 8)) for seg in (8, 4, 16)})
CONFIGS.update({f"s8 v64 w8 m{bc} mw{w}": dict(segment_chunks=8, state_block_v=64, state_warps=8, state_stages=2,
                                               maps_block=bc, maps_warps=w) for bc, w in ((128, 8), (64, 8))})
TEST_CONFIGS = ("serial", "s4 v64 w8", "s8 v128 w4", "s16 v32 w4")
SEGMENT_STAGES = ("maps", "merge", "state")
TIMEOUT = 180           # seconds a configuration's process may run (--budget + TIMEOUT < 600: one device command)


def _shapes(kind: str) -> dict:
    from bench.gdn_gpu import CHUNKED_SHAPES

    return {label: CHUNKED_SHAPES[label] for label in GPU_SHAPES} if kind == "gpu" else TEST_SHAPES


def _compare(a, b) -> dict:
    """max |a - b| and |a - b| / |b| (l2) of two tensors."""
    d = a.double() - b.double()
    return {"max_abs": float(d.abs().max()), "rel_l2": float(d.norm() / max(float(b.double().norm()), 1e-30))}


def run_config(kind: str, name: str) -> dict:
    """{shape label: {"o": _compare, "pool": _compare, quantity: [median, min, max] ms or "failed"}} of
    configuration ``name`` against the serial path (output and pool), every step of every shape in its own try."""
    import torch

    from bench.gdn_gpu import chunked_inputs
    from optimized.triton import gdn_chunked

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = CONFIGS[name]
    result = {}
    for label, shape in _shapes(kind).items():
        row = result.setdefault(label, {})
        try:
            x = chunked_inputs(shape, device)
            serial_pool = x["state"].clone()
            serial_out, _, _ = _staged(gdn_chunked, x, serial_pool)
            pool = x["state"].clone()
            out, whole, launches = _staged(gdn_chunked, x, pool, **config)
            row["o"], row["pool"] = _compare(out, serial_out), _compare(pool, serial_pool)
            print(f"{label:30} {name:14} o {row['o']} pool {row['pool']}", flush=True)
        except Exception:
            print(f"{label} {name} check: FAILED\n{traceback.format_exc()}", flush=True)
            row["check"] = "failed: " + traceback.format_exc().strip().splitlines()[-1][:300]
            continue
        if device != "cuda":
            row["timing"] = "no GPU: not timed"
            continue
        names = [n for n in SEGMENT_STAGES if n in launches]

        def together():
            for n in names:
                launches[n]()
        for quantity, fn in [("whole", whole), ("state path", together)] + [(n, launches[n]) for n in names]:
            try:
                row[quantity] = list(_samples(fn))
                print(f"{label:30} {name:14} {quantity:10} {row[quantity][0]:.4f} ms", flush=True)
            except Exception:
                print(f"{label} {name} {quantity}: FAILED\n{traceback.format_exc()}", flush=True)
                row[quantity] = "failed"
    return result


def _in_process(out: Path, kind: str, name: str) -> dict:
    """``run_config`` in a child process (its output passed through); {"error": ...} where it dies or hangs."""
    cmd = [sys.executable, "-m", "bench.probes.gdn_chunked_segments", "--out", str(out), "--shapes", kind,
           "--run-config", name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT} s"}
    print(done.stdout, end="", flush=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        print("\n".join(tail), flush=True)
        return {"error": f"exit {done.returncode}: " + " | ".join(tail[-3:])[:600]}
    return json.loads(lines[-1][len("RESULT "):])


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (the interpreter)"


def _ms(v) -> str:
    return f"{v[0]:9.4f}" if isinstance(v, list) else f"{'-':>9}"


def table(results: dict) -> list[str]:
    """One line per configuration and shape: whole and state-path ms (medians), o and pool rel_l2 vs serial."""
    lines = [f"{'config':14} {'shape':30} {'whole ms':>9} {'state ms':>9} {'o rel_l2':>9} {'pool rel_l2':>11}  notes"]
    for name, result in results.items():
        if "error" in result:
            lines.append(f"{name:14} {'(all)':30} {'-':>9} {'-':>9} {'-':>9} {'-':>9}  {result['error'][:120]}")
            continue
        for label, row in result.items():
            o, s = row.get("o", {}), row.get("pool", {})
            note = row.get("check", row.get("timing", ""))
            lines.append(f"{name:14} {label:30} {_ms(row.get('whole'))} {_ms(row.get('state path'))} "
                         f"{o.get('rel_l2', float('nan')):9.2e} {s.get('rel_l2', float('nan')):11.2e}  {note}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", choices=("gpu", "test"), default="gpu",
                    help="gpu: the gdn/chunked-gpu shapes; test: small shapes (the interpreter's end-to-end run)")
    ap.add_argument("--configs", nargs="*", default=None,
                    help=f"names of CONFIGS (default: all; with --shapes test {list(TEST_CONFIGS)})")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds after which no configuration starts")
    ap.add_argument("--run-config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_config is not None:
        print("RESULT " + json.dumps(run_config(args.shapes, args.run_config)), flush=True)
        return 0
    names = args.configs if args.configs is not None else list(CONFIGS if args.shapes == "gpu" else TEST_CONFIGS)
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        print(f"--configs: unknown {bad}; expected names of {list(CONFIGS)}")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, results = time.monotonic(), {}
    measured = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": _device(),
                "command": " ".join(["python -m bench.probes.gdn_chunked_segments"] + sys.argv[1:])}
    for name in names:
        if time.monotonic() - start > args.budget:
            results[name] = {"error": f"skipped: past the {args.budget:g} s budget"}
            continue
        results[name] = _in_process(out, args.shapes, name)
        (out / "gdn_chunked_segments.json").write_text(json.dumps(
            {"measured": measured, "configs": {n: CONFIGS[n] for n in names}, "shapes": args.shapes,
             "results": results}, indent=1) + "\n")
    print()
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
