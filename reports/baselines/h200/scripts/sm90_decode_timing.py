"""The script behind ``tq_decode_sm90.json`` (H200): the sm_90 Gluon decode (``tq_decode_sm90``) against the
portable grouped decode, torch SDPA on a bf16 cache and a device copy, in one process, at B=32, Hk=8, G=8,
D=128, turboquant_4bit_nc, SoA, block 16, L = 8192 and 32768 (every sequence full). CUDA-graph replays
timed by ``triton.testing.do_bench`` (device events): min / median / max of the repetitions, in passes that
alternate the decodes. The parts of the sm_90 step (query rotation, kernel, reduce) are timed alone. Before
timing, each configuration's largest error against the exact (fp32) grouped decode is printed, and a few
small shapes (G 1/6/16, block 32/64, D 64, sinks) are compared the same way.
From the repository root on a GPU: ``PYTHONPATH=. OUT=DIR python3 reports/baselines/h200/scripts/sm90_decode_timing.py``.
"""
import json
import os

import torch
import triton

from optimized.triton import bench
from optimized.triton.tq_decode_launch import DecodeWorkspace, check_decode_args, reduce_partials, rotate_queries
from optimized.triton.tq_decode_lut import decode_grouped
from optimized.triton.tq_decode_sm90 import decode_sm90, sm90_stage1

P = bench.PRESET
OUT = os.environ.get("OUT", ".")


def stats(fn, rep_ms=150):
    """min / median / max ms of CUDA-graph replays of ``fn``."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn()
    t = sorted(triton.testing.do_bench(graph.replay, warmup=25, rep=rep_ms, return_mode="all"))
    return {"min": t[0], "median": t[len(t) // 2], "max": t[-1], "n": len(t)}


def small_checks():
    """Largest |sm90 - exact grouped| over small caches of other shapes (relative to max |exact|)."""
    rows = []
    for B, Hk, G, D, L, bs, sinks in ((3, 2, 8, 128, 300, 16, False), (3, 2, 8, 128, 300, 16, True),
                                      (2, 2, 16, 128, 257, 32, False), (2, 4, 6, 128, 100, 16, True),
                                      (2, 8, 1, 128, 77, 64, False), (2, 2, 4, 64, 130, 16, False),
                                      (2, 2, 8, 256, 99, 16, False)):
        case = bench.build_case(B, Hk, G, D, -(-L // bs) * bs, block_size=bs, seed=1)
        case["seq_lens"] = torch.tensor([L - 3 * i for i in range(B)], dtype=torch.int32, device="cuda")
        sk = torch.randn(Hk * G, device="cuda") if sinks else None
        args = (case["query"], case["cache"], case["block_table"], case["seq_lens"])
        kw = dict(preset=P, layout="soa", rotation=case["rotation"], sinks=sk)
        ref = decode_grouped(*args, **kw, precision="exact").float()
        try:
            got = decode_sm90(*args, **kw).float()
            err = float((got - ref).abs().max() / ref.abs().max())
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"[:300]
        rows.append({"B": B, "Hk": Hk, "G": G, "D": D, "L": L, "bs": bs, "sinks": sinks, "rel_err": err})
        print("check", rows[-1], flush=True)
    return rows


def main():
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "checks": small_checks(), "copy_Bps": bench.copy_bandwidth(), "cases": []}
    B, Hk, G, D = 32, 8, 8, 128
    slot = 134
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for L in (8192, 32768):
        case = bench.build_case(B, Hk, G, D, L)
        args = (case["query"], case["cache"], case["block_table"], case["seq_lens"])
        ws = DecodeWorkspace(B, Hk * G, D, max_splits=64)
        out = torch.empty(B, Hk * G, D, dtype=torch.bfloat16, device="cuda")
        common = dict(preset=P, layout="soa", rotation=case["rotation"], workspace=ws, out=out)
        exact = decode_grouped(*args, **{**common, "out": None}, precision="exact").float()
        q = torch.randn(B, Hk * G, 1, D, device="cuda", dtype=torch.bfloat16)
        kb = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
        vb = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
        decodes = {"torch sdpa bf16": lambda: torch.nn.functional.scaled_dot_product_attention(q, kb, vb, enable_gqa=True),
                   "grouped (portable)": lambda: decode_grouped(*args, **common)}
        for bn in (16, 32):
            for S in (8, 16, 32):
                decodes[f"sm90 N={bn} S={S}"] = (lambda bn=bn, S=S: decode_sm90(*args, **common, block_n=bn,
                                                                           num_kv_splits=S))
        errs = {}
        for name, fn in decodes.items():
            if name.startswith("torch"):
                continue
            try:
                fn()
                torch.cuda.synchronize()
                errs[name] = float((out.float() - exact).abs().max())
            except Exception as exc:
                errs[name] = f"{type(exc).__name__}: {exc}"[:300]
        times = {name: [] for name in decodes if not isinstance(errs.get(name, 0.0), str)}
        for _ in range(2):  # two passes, alternating the decodes
            for name in times:
                times[name].append(stats(decodes[name]))
        row = {"L": L, "tq_bytes": B * L * Hk * slot, "bf16_bytes": B * L * Hk * D * 4, "err_vs_exact": errs,
               "times": times}
        # parts of the default sm90 step
        a = check_decode_args(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=P,
                              layout="soa", rotation=case["rotation"], scale=None, sinks=None)
        row["parts"] = {"rotate": stats(lambda: rotate_queries(case["query"], case["rotation"], ws.q_rot, True))}
        for bn, S in ((16, 8), (16, 16), (32, 8)):
            row["parts"][f"N={bn} S={S}"] = {
                "kernel": stats(lambda: sm90_stage1(a, S, ws, case["cache"], case["block_table"], case["seq_lens"], bn)),
                "reduce": stats(lambda: reduce_partials(ws, case["seq_lens"], out, S, align=bn))}
        res["cases"].append(row)
        del kb, vb, case
        torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
    json.dump(res, open(os.path.join(OUT, "tq_decode_sm90.json"), "w"), indent=1)
    copy = res["copy_Bps"]
    print(f"{res['device']} torch {res['torch']} triton {res['triton']} copy {copy / 1e12:.2f} TB/s, {sms} SMs")
    print(f"{'L':>6} {'decode':22} {'min':>8} {'median':>8} {'max':>8} {'x sdpa':>7} {'%copy':>6}")
    for row in res["cases"]:
        sd = min(t["median"] for t in row["times"]["torch sdpa bf16"])
        for name, ts in row["times"].items():
            med = min(t["median"] for t in ts)
            lo, hi = min(t["min"] for t in ts), max(t["max"] for t in ts)
            frac = row["tq_bytes"] / (med * 1e-3) / copy
            print(f"{row['L']:>6} {name:22} {lo:8.4f} {med:8.4f} {hi:8.4f} {med / sd:7.3f} "
                  f"{'' if name.startswith('torch') else f'{100 * frac:5.1f}%'}")
        p = row["parts"]
        for k, v in p.items():
            if k != "rotate":
                print(f"{row['L']:>6} parts {k}: rotate {p['rotate']['median']:.4f} kernel {v['kernel']['median']:.4f} "
                      f"reduce {v['reduce']['median']:.4f} ms")


if __name__ == "__main__":
    main()
