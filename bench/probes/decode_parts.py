"""The parts of one ``decode_grouped`` step timed alone (CUDA-graph medians) at B=32, Hk=8, G=8,
D=128, L=8192: query rotation, the grouped kernel (default configuration: 16-entry table,
BLOCK_N 128, the default split count), the reduce, and ``torch.matmul`` doing the rotation's
product; torch SDPA on a bf16 cache beside them. Writes ``tq_decode_parts.json``:
``python -m bench.probes.decode_parts --out DIR`` (on a GPU)."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    import torch

    from bench.turboquant_gpu import decode_inputs
    from bench.probes.common import graph_ms, impl_ms, out_dir, shape, write_json
    from optimized.triton.tq_decode_launch import (DecodeWorkspace, check_decode_args, default_num_splits,
                                                   reduce_partials, rotate_queries)
    from optimized.triton.tq_decode_grouped import decode_grouped, grouped_stage1

    out_path = out_dir(__doc__.splitlines()[0], argv) / "tq_decode_parts.json"
    s = shape(8192)
    B, Hk, G, D, L = (s[k] for k in ("B", "Hk", "G", "D", "L"))
    case = decode_inputs(s)
    q, cache, bt, lens, rot = case["query"], case["cache"], case["block_table"], case["seq_lens"], case["rotation"]
    ws = DecodeWorkspace(B, Hk * G, D, max_splits=32)
    out = torch.empty(B, Hk * G, D, dtype=torch.bfloat16, device="cuda")
    common = dict(preset=s["preset"], layout=s["layout"], rotation=rot, workspace=ws, out=out)
    splits = default_num_splits(B, Hk, L, 128, cache.device, 32)
    res = {"splits": splits, "sdpa_ms": impl_ms("torch-sdpa", s, case)}
    res["decode_grouped"] = graph_ms(lambda: decode_grouped(q, cache, bt, lens, **common))
    res["rotate"] = graph_ms(lambda: rotate_queries(q, rot, ws.q_rot, True))
    res["reduce"] = graph_ms(lambda: reduce_partials(ws, lens, out, splits, align=128))
    args = check_decode_args(q, cache, bt, lens, preset=s["preset"], layout=s["layout"], rotation=rot,
                             scale=None, sinks=None)
    res["main kernel"] = graph_ms(lambda: grouped_stage1(args, splits, ws, cache, bt, lens, mma="bf16",
                                                         keys="gather", block_n=128))
    qf = torch.empty(B * Hk * G, D, device="cuda")
    res["torch matmul rotate"] = graph_ms(lambda: torch.matmul(q.view(-1, D).float(), rot, out=qf))
    for k, v in res.items():
        print(f"{k:22s} {v:.4f}")
    write_json(out_path, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
