"""Where the dequantized tiles of the grouped decode go on the way to the matrix unit, from the
code Triton generates for sm_90 (compiled ahead of time, no GPU needed):

- the production kernel (``tq_decode_grouped._grouped_kernel``, both key methods): the bf16 tiles that
  the decode loop writes to shared memory (``ttg.local_alloc`` of a register tensor), each of which
  is read back (``ldmatrix``) as a wgmma register operand;
- two probes of one ``tl.dot`` with a 4-bit operand: ``elementwise`` builds it by elementwise ops
  from a load of the same shape (one int32 per element), ``packed`` unpacks eight codes per 32-bit
  word with ``tl.join``/``tl.reshape`` as the decode must (the cache packs them). Triton hoists the
  first into the operand's register layout (a ``local_load`` straight to ``dot_op``) and round-trips
  the second's bf16 tile through shared memory.

Run from the repository root: ``python -m bench.probes.operand_path_sm90``."""
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl

from optimized.triton.compile_check import compiled, kernels


@triton.jit
def _probe(w_ptr, b_ptr, c_ptr, PACKED: tl.constexpr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.zeros((M, N), tl.float32)
    for i in range(0, 8):
        if PACKED:  # eight 4-bit codes per int32 word, unpacked as the decode's value operand is
            rw = tl.arange(0, K // 8)
            w = tl.load(w_ptr + i * M * (K // 8) + rm[:, None] * (K // 8) + rw[None, :])
            r = tl.join(tl.join(w & 0x000F000F, (w >> 4) & 0x000F000F),
                        tl.join((w >> 8) & 0x000F000F, (w >> 12) & 0x000F000F)) | 0x43004300
            h = tl.join(r.to(tl.int16), (r >> 16).to(tl.int16)).to(tl.bfloat16, bitcast=True)
            a = tl.reshape(h, (M, K))
        else:  # one code per int32 element
            w = tl.load(w_ptr + i * M * K + rm[:, None] * K + rk[None, :])
            a = ((w & 15) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


WIDTH = {"128": 16, "64": 8, "U16": 2, "U8": 1, "4": 16, "2": 8}  # bytes per lane (LDSM .x4/.x2: matrices)


def loop_shared_bytes(k, num_warps: int = 4) -> dict:
    """Bytes the largest loop of ``k`` moves through shared memory per iteration, by SASS opcode
    (STS: stores of registers, LDSM: ldmatrix reads into a dot-operand layout, LDS: other reads;
    cp.async copies, LDGSTS, are left out): lanes x width x warps, from nvdisasm of the cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
        text = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    labels, ops = {}, []
    for line in text.splitlines():
        label = re.match(r"^\s*\.?(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
        op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", line)
        if op:
            ops.append((op.group(1), op.group(2)))
    loops = [ops[labels[t.group(1)]:i + 1] for i, (op, rest) in enumerate(ops) if op.startswith("BRA")
             for t in [re.search(r"`\(\.?(L_x_\d+)\)", rest)] if t and labels.get(t.group(1), i + 1) <= i]
    out = {"STS": 0, "LDSM": 0, "LDS": 0}
    for op, _ in max(loops, key=len):
        parts = op.split(".")
        if parts[0] in out:
            out[parts[0]] += 32 * num_warps * next((WIDTH[p] for p in reversed(parts[1:]) if p in WIDTH), 4)
    return out


def main() -> int:
    print(f"triton {triton.__version__}, target cuda:90; bytes through shared memory per loop iteration (4 warps)")
    for spec in kernels():
        if spec.name.startswith("grouped"):
            print(f"{spec.name:26} tile of {spec.consts['BLOCK_N']} tokens: "
                  f"{loop_shared_bytes(compiled(spec.fn, spec.types, spec.consts, 'cuda:90'))}")
    types = {"w_ptr": "*i32", "b_ptr": "*bf16", "c_ptr": "*fp32"}
    for packed in (False, True):
        k = compiled(_probe, types, dict(PACKED=packed, M=128, K=128, N=16), "cuda:90")
        print(f"probe {'packed' if packed else 'elementwise':20} 128x128 operand: {loop_shared_bytes(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
