"""The script behind ``tq_decode_parts.json`` (H200; third session, rerun in the fourth): the parts of one
``decode_grouped`` step timed alone (CUDA-graph medians): query rotation, the grouped kernel
(default configuration at this shape: 16-entry table, BLOCK_N 128, 4 splits), the reduce, and
``torch.matmul`` doing the rotation's product. Run from the repository root on a GPU:
``PYTHONPATH=. OUT=DIR python3 reports/baselines/h200/scripts/decode_parts.py``."""
import json, os
import torch, triton
from optimized.triton import bench
from optimized.triton.tq_decode_launch import DecodeWorkspace, rotate_queries, reduce_partials, centroid_table
from optimized.triton.tq_decode_lut import decode_grouped, _grouped_kernel
from reference.turboquant.presets import preset as lookup

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
table = centroid_table(lookup(bench.PRESET), D, cache.device, bf16_bits=True)
def main():
    _grouped_kernel[(B, Hk, S)](ws.q_rot, cache, bt, lens, table, ws.q_rot, ws.partials, cache.stride(0), bt.stride(0),
                                1.0 / D ** 0.5, D=D, HK=Hk, BS=16, KEY_BYTES=64, VAL_BYTES=64, HQ=Hk * G, G=G, S=S,
                                MAXS=32, HAS_SINKS=False, GP=8, BLOCK_N=128, KEYS="gather", TABLE=16, BF16=True,
                                num_warps=4, num_stages=3)
res["main kernel"] = bench.graph_ms(main)
qf = torch.empty(B * Hk * G, D, device="cuda")
res["torch matmul rotate"] = bench.graph_ms(lambda: torch.matmul(q.view(-1, D).float(), rot, out=qf))
for k, v in res.items():
    print(f"{k:22s} {v:.4f} ms")
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "tq_parts.json"), "w"), indent=1)
