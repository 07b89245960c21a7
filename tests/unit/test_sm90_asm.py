"""The inline PTX of the sm_90 decode (``tq_decode_sm90``), run by a small interpreter of the
instructions it uses on random words: the key lookup against the centroid table (bf16 and fp16),
the value unpacking against the nibbles, for every operand format (``VALUE_CODES``)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from optimized.triton import tq_decode_sm90 as sm90
from optimized.triton.tq_decode_launch import centroid_table
from reference.turboquant.presets import preset

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, c: int) -> int:
    src = (b << 32) | a
    out = 0
    for k in range(4):
        sel = (c >> (4 * k)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for i in range(32):
        idx = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1)
        out |= ((lut >> idx) & 1) << i
    return out


def _sub_f16x2(a: int, b: int) -> int:
    x = np.array([a & 0xFFFF, a >> 16], np.uint16).view(np.float16)
    y = np.array([b & 0xFFFF, b >> 16], np.uint16).view(np.float16)
    r = (x - y).view(np.uint16)
    return int(r[0]) | (int(r[1]) << 16)


OPS = {"shr.u32": lambda a, b: a >> b, "shl.b32": lambda a, b: (a << b) & M32, "and.b32": lambda a, b: a & b,
       "mul.lo.u32": lambda a, b: (a * b) & M32, "mov.b32": lambda a: a, "prmt.b32": _prmt, "lop3.b32": _lop3,
       "sub.rn.f16x2": _sub_f16x2}


def run_asm(asm: str, inputs: list[int], outputs: int) -> list[int]:
    """Run ``asm`` ($0..$outputs-1 written, then $outputs.. the inputs) on 32-bit ``inputs``."""
    regs = {f"${outputs + i}": v & M32 for i, v in enumerate(inputs)}
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        args = [a.strip() for a in args.split(",")]
        vals = [regs[a] if not re.fullmatch(r"(0x[0-9a-fA-F]+|\d+)", a) else int(a, 0) for a in args[1:]]
        regs[args[0]] = OPS[op](*vals) & M32
    return [regs[f"${i}"] for i in range(outputs)]


@pytest.mark.parametrize("mma", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_key_lookup_gives_the_centroid_of_every_nibble(mma, D):
    bits = centroid_table(preset(sm90.PRESET), D, "cpu", mma).tolist()
    table = sm90.key_table_words(bits)
    rng = np.random.default_rng(D)
    for w in [0, M32, 0x76543210, 0xFEDCBA98] + rng.integers(0, 1 << 32, 200).tolist():
        out = run_asm(sm90.KEY_ASM.value, [w, *table], 4)
        got = [(out[i // 2] >> (16 * (i % 2))) & 0xFFFF for i in range(8)]
        assert got == [bits[(w >> (4 * i)) & 15] for i in range(8)], hex(w)


def test_key_table_refuses_an_asymmetric_table():
    bits = centroid_table(preset(sm90.PRESET), 128, "cpu", "bf16").tolist()
    bits[3] ^= 1
    with pytest.raises(ValueError, match="symmetric"):
        sm90.key_table_words(bits)


@pytest.mark.parametrize("values", range(len(sm90.VALUE_CODES)))
def test_value_unpacking_gives_each_code_in_its_operand_format(values):
    asm = (sm90.VALUE_ASM_BF16, sm90.VALUE_ASM_FP16_SUBNORMAL, sm90.VALUE_ASM_FP16_INTEGER)[values].value
    dt = torch.bfloat16 if values == 0 else torch.float16
    unit, offset = {0: (1.0, 128.0), 1: (2.0**-24, 0.0), 2: (1.0, 0.0)}[values]
    rng = np.random.default_rng(values)
    for we, wo in rng.integers(0, 1 << 32, (200, 2)).tolist():
        out = run_asm(asm, [we, wo], 8)
        halves = torch.tensor([[o & 0xFFFF, o >> 16] for o in out], dtype=torch.int32).to(torch.int16).view(dt).float()
        # register i: (code i of the even token, code i of the odd token); code i is nibble i of the word
        want = torch.tensor([[((we >> (4 * i)) & 15) * unit + offset, ((wo >> (4 * i)) & 15) * unit + offset]
                             for i in range(8)])
        assert torch.equal(halves, want), (hex(we), hex(wo))
