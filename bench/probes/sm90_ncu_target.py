"""The process ncu profiles for ``tq_decode_sm90_ncu.txt``: three steps of the sm_90 decode (its default
configuration), then, with a path argument, three of an earlier copy of ``tq_decode_sm90.py`` (its default),
then three of the portable grouped decode, at B=32, Hk=8, G=8, D=128, L=8192 (turboquant_4bit_nc, SoA, block
16, bfloat16); ncu takes the third launch of each. From the repository root on an sm_90 GPU:

    ncu --clock-control none -k regex:"_sm90_kernel|_grouped_kernel" --launch-skip 2 --launch-count 7 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,\\
    dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed,\\
    smsp__issue_active.avg.pct_of_peak_sustained_active \\
        python3 -m bench.probes.sm90_ncu_target [PREVIOUS_FILE] > tq_decode_sm90_ncu.txt

(launches 2, 5 and 8 are the third of each; the others are in the file too).
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    import torch

    from bench.turboquant_gpu import decode_inputs, grouped, launcher, sm90
    from bench.probes.common import shape
    from bench.probes.sm90_decode import load_previous

    argv = sys.argv[1:] if argv is None else argv
    s = shape(8192)
    case = decode_inputs(s)
    loads = [sm90] + ([lambda: load_previous(argv[0])] if argv else []) + [grouped]
    for load in loads:
        step = launcher(load)(s, case)
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
