"""The sm_90 Gluon decode (``tq_decode_sm90``) in configurations beside the registry's
``turboquant/decode`` bench (its default ``triton-sm90``, the portable grouped decode, SDPA, the
ceilings), in the same run: BLOCK_N 16 and 32 with 8, 16 and 32 splits, registered for this run only.
Before timing, the largest error of each against the exact (fp32) grouped decode at small shapes (G 1,
4, 6, 8, 16; blocks 16, 32, 64; D 64, 128, 256; sinks); after it, the parts of one step timed alone
(query rotation, kernel, reduce). Writes ``tq_decode_sm90.json`` (the perf-JSON records plus
``checks`` and ``parts``): ``python -m bench.probes.sm90_decode --out DIR`` (on an sm_90 GPU).
"""
from __future__ import annotations

import sys

CONFIGS = {f"sm90-n{n}-s{s}": dict(block_n=n, num_kv_splits=s) for n in (16, 32) for s in (8, 16, 32)}
PART_CONFIGS = ((16, 8), (16, 16), (32, 8))  # (BLOCK_N, splits) of the parts
SMALL = ((3, 2, 8, 128, 300, 16, False), (3, 2, 8, 128, 300, 16, True), (2, 2, 16, 128, 257, 32, False),
         (2, 4, 6, 128, 100, 16, True), (2, 8, 1, 128, 77, 64, False), (2, 2, 4, 64, 130, 16, False),
         (2, 2, 8, 256, 99, 16, False))  # B, Hk, G, D, longest sequence, block size, sinks


def checks() -> list[dict]:
    """Largest |sm90 - exact grouped| over max |exact| at the ``SMALL`` shapes, sequences of
    ``L, L - 3, ...`` tokens."""
    import torch

    from bench.turboquant_gpu import PRESET, decode_inputs
    from optimized.triton.tq_decode_grouped import decode_grouped
    from optimized.triton.tq_decode_sm90 import decode_sm90

    rows = []
    for B, Hk, G, D, L, bs, sinks in SMALL:
        case = decode_inputs(dict(B=B, Hk=Hk, G=G, D=D, L=-(-L // bs) * bs, block_size=bs, preset=PRESET,
                                  layout="soa"))
        lens = torch.tensor([L - 3 * i for i in range(B)], dtype=torch.int32, device="cuda")
        args = (case["query"], case["cache"], case["block_table"], lens)
        kw = dict(preset=PRESET, layout="soa", rotation=case["rotation"],
                  sinks=torch.randn(Hk * G, device="cuda") if sinks else None)
        ref = decode_grouped(*args, **kw, precision="exact").float()
        err = float((decode_sm90(*args, **kw).float() - ref).abs().max() / ref.abs().max())
        rows.append({"B": B, "Hk": Hk, "G": G, "D": D, "L": L, "block_size": bs, "sinks": sinks, "rel_err": err})
        print("check", rows[-1], flush=True)
    return rows


def parts(L: int) -> dict:
    """Median ms of the query rotation, the kernel and the reduce of one step at length ``L``, per
    (BLOCK_N, splits) of ``PART_CONFIGS``."""
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
    res = {"rotate": graph_ms(lambda: rotate_queries(case["query"], case["rotation"], ws.q_rot, True))}
    for n, S in PART_CONFIGS:
        res[f"n{n}-s{S}"] = {
            "kernel": graph_ms(lambda: sm90_stage1(a, S, ws, case["cache"], a.block_table, a.seq_lens, n)),
            "reduce": graph_ms(lambda: reduce_partials(ws, a.seq_lens, out, S, align=n))}
    print(f"L={L} parts", res, flush=True)
    return res


def main(argv=None) -> int:
    from bench import registry, run
    from bench.measure import measure
    from bench.registry import Impl
    from bench.turboquant_gpu import launcher, sm90, sm90_available
    from bench.probes.common import out_dir, write_json

    out_path = out_dir(__doc__.splitlines()[0], argv) / "tq_decode_sm90.json"
    ok, why = sm90_available()
    if not ok:
        print(why)
        return 1
    found = checks()
    configs = [Impl(bench="turboquant/decode", name=n, role="ours", prepare=launcher(sm90, **kw),
                    available=sm90_available) for n, kw in CONFIGS.items()]
    with registry.registered(*configs):
        records = {r.rid: r for r in measure("turboquant/decode")}
    for rid, r in records.items():
        if r.skip is not None:
            print(f"{rid:45} {r.skip}")
            continue
        t, sdpa = r.extra_info["time_s"], records[rid.rsplit("/", 1)[0] + "/torch-sdpa"].extra_info["time_s"]
        print(f"{rid:45} min {t['min'] * 1e3:8.4f} median {t['median'] * 1e3:8.4f} max {t['max'] * 1e3:8.4f} ms "
              f"x sdpa {t['median'] / sdpa['median']:.3f} "
              + " ".join(f"{k} {v:.3f}" for k, v in r.extra_info["fraction_of"].items()))
    write_json(out_path, {**run.perf_json(records, []), "checks": found,
                          "parts": {L: parts(L) for L in (8192, 32768)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
