"""The script behind ``tq_decode_parts.json`` (H200; third session, rerun in the fourth): the parts of one
``decode_grouped`` step timed alone (CUDA-graph medians): query rotation, the grouped kernel
(default configuration at this shape: 16-entry table, BLOCK_N 128, 4 splits), the reduce, and
``torch.matmul`` doing the rotation's product. Run from the repository root on a GPU:
``PYTHONPATH=. OUT=DIR python3 reports/baselines/h200/scripts/decode_parts.py``."""
import json, os
import torch
from optimized.triton import bench
from optimized.triton.tq_decode_launch import DecodeWorkspace, check_decode_args, rotate_queries, reduce_partials
from optimized.triton.tq_decode_grouped import decode_grouped, grouped_stage1

B, Hk, G, D, L = 32, 8, 8, 128, 8192
case = bench.build_case(B, Hk, G, D, L)
sdpa = bench.time_sdpa(B, Hk, G, D, L)
q, cache, bt, lens, rot = case["query"], case["cache"], case["block_table"], case["seq_lens"], case["rotation"]
ws = DecodeWorkspace(B, Hk * G, D, max_splits=32)
out = torch.empty(B, Hk * G, D, dtype=torch.bfloat16, device="cuda")
common = dict(preset=bench.PRESET, layout="soa", rotation=rot, workspace=ws, out=out)
res = {"sdpa_ms": sdpa}
res["decode_grouped"] = bench.graph_ms(lambda: decode_grouped(q, cache, bt, lens, **common))
res["rotate"] = bench.graph_ms(lambda: rotate_queries(q, rot, ws.q_rot, True))
S = 4
res["reduce"] = bench.graph_ms(lambda: reduce_partials(ws, lens, out, S, align=128))
args = check_decode_args(q, cache, bt, lens, preset=bench.PRESET, layout="soa", rotation=rot, scale=None, sinks=None)
res["main kernel"] = bench.graph_ms(lambda: grouped_stage1(args, S, ws, cache, bt, lens, bf16=True, keys="gather",
                                                           block_n=128))
qf = torch.empty(B * Hk * G, D, device="cuda")
res["torch matmul rotate"] = bench.graph_ms(lambda: torch.matmul(q.view(-1, D).float(), rot, out=qf))
for k, v in res.items():
    print(f"{k:22s} {v:.4f} ms")
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "tq_parts.json"), "w"), indent=1)
