"""The sm_90 Gluon decode (``tq_decode_sm90``) in configurations beside the registry's
``turboquant/decode`` bench (its default ``triton-sm90``, the portable grouped decode, SDPA, the
ceilings), in the same run, registered for this run only: register prefetch (stages 1) and cp.async rings
(stages 2 to 4), BLOCK_N 16 and 32, split counts, the earlier default (8 programs a multiprocessor, 4 stages),
float16 value codes as integers, and, with
``--previous FILE``, an earlier version of the kernel's module (its default configuration, bfloat16).
Before timing, the largest error of each configuration against the exact (fp32) grouped decode at a
small shape with the bench's kernel constants (so the timing reuses the compiled kernels), bfloat16 and
float16; after it, the parts of the default's step timed alone (query rotation, kernel, reduce). Writes
``tq_decode_sm90.json`` (the perf-JSON records, the gates of this run, ``checks`` and ``parts``):
``python -m bench.probes.sm90_decode --out DIR [--previous FILE]`` (on an sm_90 GPU).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# name -> decode_sm90 options (None: the previous version's module); r: ring stages (1: register prefetch), n: BLOCK_N,
# s: splits (else ``programs_per_sm``'s), pps: programs a multiprocessor
CONFIGS = {"sm90-r1-n16": dict(stages=1, block_n=16), "sm90-r3-n16": dict(stages=3, block_n=16),
           "sm90-r1-n32": dict(stages=1, block_n=32), "sm90-r3-n32": dict(stages=3, block_n=32),
           "sm90-r4-n32": dict(stages=4, block_n=32), "sm90-r4-n16-s8": dict(stages=4, block_n=16, num_kv_splits=8),
           "sm90-r4-n16-s12": dict(stages=4, block_n=16, num_kv_splits=12),
           "sm90-r4-n32-s8": dict(stages=4, block_n=32, num_kv_splits=8),
           "sm90-r4-n16-int": dict(stages=4, block_n=16, fp16_values="integer"),
           "sm90-r4-n32-pps8": dict(stages=4, block_n=32, programs_per_sm=8),
           "sm90-r3-n32-s4": dict(stages=3, block_n=32, num_kv_splits=4),
           "sm90-r2-n32-s6": dict(stages=2, block_n=32, num_kv_splits=6)}
PREVIOUS = "sm90-previous"


def load_previous(path: str):
    """The ``decode_sm90`` of another copy of ``tq_decode_sm90.py`` (imported under its own name)."""
    spec = importlib.util.spec_from_file_location("tq_decode_sm90_previous", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.decode_sm90


def checks(launchers: dict) -> list[dict]:
    """Largest |decode - exact grouped| over max |exact| of each launcher at B=3, L=1000, 997, 994
    (the bench's G, Hk, D, block size and 16 splits: its compiled kernels), bfloat16 and float16."""
    import torch

    from bench.turboquant_gpu import PRESET, decode_inputs
    from bench.probes.common import shape
    from optimized.triton.tq_decode_grouped import decode_grouped
    from optimized.triton.tq_decode_launch import DecodeWorkspace

    rows = []
    for act in ("bfloat16", "float16"):
        s = dict(shape(8192), B=3, L=1024, act=act)
        case = decode_inputs(s)
        lens = torch.tensor([1000, 997, 994], dtype=torch.int32, device="cuda")
        args = (case["query"], case["cache"], case["block_table"], lens)
        kw = dict(preset=PRESET, layout="soa", rotation=case["rotation"])
        ref = decode_grouped(*args, **kw, precision="exact").float()
        for name, (fn, opts) in launchers.items():
            if name == PREVIOUS and act != "bfloat16":
                continue
            ws = DecodeWorkspace(3, s["Hk"] * s["G"], s["D"], max_splits=32)
            opts = {"num_kv_splits": 16, **opts}
            try:
                out = fn(*args, **kw, workspace=ws, **opts).float()
                err = float((out - ref).abs().max() / ref.abs().max())
            except Exception as exc:  # a configuration that fails is reported, not the end of the probe
                err = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append({"config": name, "act": act, "rel_err": err})
            print("check", rows[-1], flush=True)
    return rows


def parts(L: int) -> dict:
    """Median ms of the query rotation, the default kernel and the reduce of one step at length ``L``."""
    import torch

    from bench.turboquant_gpu import decode_inputs
    from bench.probes.common import graph_ms, shape
    from optimized.triton.tq_decode_launch import DecodeWorkspace, check_decode_args, reduce_partials, rotate_queries
    from optimized.triton.tq_decode_sm90 import sm90_stage1

    s = shape(L)
    case = decode_inputs(s)
    B, Hq, D = s["B"], s["Hk"] * s["G"], s["D"]
    ws = DecodeWorkspace(B, Hq, D, max_splits=32)
    out = torch.empty(B, Hq, D, dtype=torch.bfloat16, device="cuda")
    a = check_decode_args(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=s["preset"],
                          layout=s["layout"], rotation=case["rotation"], scale=None, sinks=None)
    res = {"rotate": graph_ms(lambda: rotate_queries(case["query"], case["rotation"], ws.q_rot, True)),
           "kernel": graph_ms(lambda: sm90_stage1(a, 16, ws, case["cache"], a.block_table, a.seq_lens, 16, "bf16", 4)),
           "reduce": graph_ms(lambda: reduce_partials(ws, a.seq_lens, out, 16, align=16))}
    print(f"L={L} parts", res, flush=True)
    return res


def main(argv=None) -> int:
    from bench import gates, registry, run
    from bench.measure import measure
    from bench.registry import Impl
    from bench.turboquant_gpu import launcher, sm90, sm90_available
    from bench.probes.common import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for the JSON files")
    ap.add_argument("--previous", help="another copy of tq_decode_sm90.py, timed as " + PREVIOUS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ok, why = sm90_available()
    if not ok:
        print(why)
        return 1
    from optimized.triton.tq_decode_sm90 import decode_sm90

    launchers = {"triton-sm90": (decode_sm90, {}), **{n: (decode_sm90, kw) for n, kw in CONFIGS.items()}}
    configs = [Impl(bench="turboquant/decode", name=n, role="ours", prepare=launcher(sm90, **kw),
                    available=sm90_available) for n, kw in CONFIGS.items()]
    if args.previous:
        previous = load_previous(args.previous)
        launchers[PREVIOUS] = (previous, {})
        configs.append(Impl(bench="turboquant/decode", name=PREVIOUS, role="ours", prepare=launcher(lambda: previous),
                            available=sm90_available, supports=lambda s: None if s["act"] == "bfloat16" else
                            "the previous sm_90 decode takes bfloat16 queries only"))
    found = checks(launchers)
    records = {}
    with registry.registered(*configs):
        for label in registry.benches()["turboquant/decode"].shapes:  # one shape at a time, written as it goes
            fresh = {r.rid: r for r in measure("turboquant/decode", [label])}
            records.update(fresh)
            for rid, r in fresh.items():
                if r.skip is not None:
                    print(f"{rid:50} {r.skip[:80]}")
                    continue
                t, sdpa = r.extra_info["time_s"], fresh[rid.rsplit("/", 1)[0] + "/torch-sdpa"].extra_info["time_s"]
                print(f"{rid:50} min {t['min'] * 1e3:8.4f} median {t['median'] * 1e3:8.4f} max {t['max'] * 1e3:8.4f} "
                      f"ms x sdpa {t['median'] / sdpa['median']:.3f} "
                      + " ".join(f"{k} {v:.3f}" for k, v in r.extra_info["fraction_of"].items()), flush=True)
            write_json(out / "tq_decode_sm90.json", {**run.perf_json(records, []), "checks": found})
    results = run.judge_all(records, gates.load(), remeasure=False)
    print(gates.table(results), flush=True)
    perf = run.perf_json(records, results)
    run.write(out / "perf.json", perf)
    write_json(out / "tq_decode_sm90.json", {**perf, "checks": found,
                                             "parts": {L: parts(L) for L in (8192, 32768)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
