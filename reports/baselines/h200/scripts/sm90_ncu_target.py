"""The process profiled for ``tq_decode_sm90_ncu.txt`` (H200): three steps of the sm_90 decode and of the
portable grouped decode at B=32, Hk=8, G=8, D=128, L=8192 (turboquant_4bit_nc, SoA, block 16); ncu takes
the third launch of each kernel. From the repository root on a GPU:

    PYTHONPATH=. ncu --clock-control none -k regex:"_sm90_kernel|_grouped_kernel" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,\\
    dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed \\
        python3 reports/baselines/h200/scripts/sm90_ncu_target.py
"""
import torch

from optimized.triton import bench
from optimized.triton.tq_decode_launch import DecodeWorkspace
from optimized.triton.tq_decode_lut import decode_grouped
from optimized.triton.tq_decode_sm90 import decode_sm90

B, Hk, G, D, L = 32, 8, 8, 128, 8192
case = bench.build_case(B, Hk, G, D, L)
ws = DecodeWorkspace(B, Hk * G, D, max_splits=64)
out = torch.empty(B, Hk * G, D, dtype=torch.bfloat16, device="cuda")
for fn in (decode_sm90, decode_grouped):
    for _ in range(3):
        fn(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=bench.PRESET, layout="soa",
           rotation=case["rotation"], workspace=ws, out=out)
torch.cuda.synchronize()
