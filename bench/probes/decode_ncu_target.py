"""The process ncu profiles for ``tq_decode_ncu.txt``: three ``decode_grouped`` steps at B=32,
Hk=8, G=8, D=128, L=8192 (turboquant_4bit_nc, SoA); ncu takes the third launch of the grouped
kernel. From the repository root on a GPU:

    ncu --clock-control none -k regex:_grouped_kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \\
        --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\\
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,\\
    smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__cycles_active.avg,\\
    l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed \\
        python3 -m bench.probes.decode_ncu_target > tq_decode_ncu.txt

``tq_decode_ncu_by_opcode.txt`` sums the per-instruction counters by SASS opcode, from
``ncu ... --section SourceCounters --section InstructionStats -o src <this target>`` and then
``ncu -i src.ncu-rep --page source --csv --print-source sass``.
"""
from __future__ import annotations

import sys


def main() -> int:
    import torch

    from bench.turboquant_gpu import decode_inputs
    from bench.probes.common import shape
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_grouped import decode_grouped

    s = shape(8192)
    case = decode_inputs(s)
    ws = DecodeWorkspace(s["B"], s["Hk"] * s["G"], s["D"], max_splits=32)
    out = torch.empty(s["B"], s["Hk"] * s["G"], s["D"], dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        decode_grouped(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=s["preset"],
                       layout=s["layout"], rotation=case["rotation"], workspace=ws, out=out)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
