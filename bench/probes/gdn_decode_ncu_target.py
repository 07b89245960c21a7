"""The process ncu profiles for the GDN decode: three steps each of today's portable kernel
(``gdn_recurrent.decode``, kernel ``_gdn_kernel``) and of the sm_90 decode (``gdn_decode_sm90.decode``,
kernel ``_decode_kernel``) on the ``gdn/decode-gpu`` inputs at ``N=128,state=<dtype>`` (argument: the pool
dtype, default bfloat16). ncu takes the third launch of each (the value checks' flag kernels are another
kernel). From the repository root on a GPU, once per kernel (KERNEL ``_gdn_kernel`` or ``_decode_kernel``):

    ncu --clock-control none -k regex:KERNEL --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \\
        --metrics smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 -m bench.probes.gdn_decode_ncu_target bfloat16
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    import torch

    from bench.gdn_gpu import SHAPES, decode_inputs
    from optimized.triton import gdn_decode_sm90, gdn_recurrent

    argv = sys.argv[1:] if argv is None else argv
    dtype = argv[0] if argv else "bfloat16"
    x = decode_inputs(SHAPES[f"N=128,state={dtype}"])
    out = torch.empty_like(x["v"])
    ws = gdn_recurrent.Workspace("cuda")
    for decode in (gdn_recurrent.decode, gdn_decode_sm90.decode):
        for _ in range(3):
            decode(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], x["state"], x["state_indices"],
                   out=out, workspace=ws)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
