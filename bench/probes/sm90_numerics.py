"""The roundings of the sm_90 decode (``tq_decode_sm90``, bfloat16) emulated in NumPy on the CPU and judged
by the family's check under its model (``act-mma-table``) and under ``act-mma``, to see which rounding decides
a cell's margin: the kernel's (bf16 rotated queries and centroid table, the fp16 norm on the fp32 score,
``bf16(P * s)`` times exact codes, the lazy running max, its split count and tiles), and the same with one
rounding removed or changed: ``P * s`` in fp32, centred codes (``code - 7.5``, the offset moved into
``v_zero``), fp32 queries, one split, keys rounded as products (``bf16(norm * centroid)``, as act-mma's
oracle rounds them), and act-mma's roundings (those keys, ``bf16(P)`` times ``bf16(V)``). Sums are float64
(the MMA's fp32 accumulation is left out).
``python -m bench.probes.sm90_numerics [PATTERN]`` (cells of the full tier whose id contains
PATTERN; default: the cell the H200 run of 80aa210 and the H100 run of 2026-12-06 failed under act-mma).
"""
from __future__ import annotations

import math
import sys

import ml_dtypes
import numpy as np

LOG2E = 1.4426950408889634
FAILED = "Hk=8/G=16/bs=16/lens=256/rotation=hadamard/sinks=off/D=128/range=unit/act=bfloat16"


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


class Emulation:
    """A decode with the reference's signature computing as the sm_90 kernel does (see the module doc);
    ``programs_per_sm`` and ``block_n`` pick its split count and tile as the launcher does on 132 SMs."""

    def __init__(self, programs_per_sm=16, block_n=16, centre=0.0, round_ps=True, round_q=True, splits=True,
                 round_keys=False, model=False):
        self.pps, self.N, self.centre = programs_per_sm, block_n, centre
        self.round_ps, self.round_q, self.splits = round_ps, round_q, splits
        self.round_keys, self.model = round_keys or model, model

    def decode(self, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        from reference.turboquant import numpy_ref, validate
        from reference.turboquant.lloyd_max import centroids
        from reference.turboquant.presets import preset as lookup

        p = lookup(preset)
        B, Hq, D = query.shape
        Hk, bs = kv_cache.shape[2], kv_cache.shape[1]
        G = Hq // Hk
        scale = 1 / math.sqrt(D) if scale is None else scale
        q = (np.asarray(query, np.float32).astype(np.float64) @ np.asarray(rotation, np.float64)).astype(np.float32)
        q = _bf16(q) if self.round_q else q.astype(np.float64)
        c0 = centroids(p.key_bits, D).astype(np.float64)
        c = _bf16(c0)
        want = 1 << (math.ceil(self.pps * 132 / (B * Hk * math.ceil(G / 8))) - 1).bit_length()
        S = max(1, min(want, 32, math.ceil(block_table.shape[1] * bs / self.N))) if self.splits else 1
        out = np.zeros((B, Hq, D))
        for b in range(B):
            L = int(seq_lens[b])
            f = numpy_ref.read_fields(np.asarray(kv_cache), validate.token_slots(np.asarray(block_table), b, L, bs),
                                      p, layout, D)
            codes = f["value_codes"].astype(np.float64)
            kn, vs, vz = (f[n].astype(np.float64) for n in ("k_norm", "v_scale", "v_zero"))
            W = math.ceil(math.ceil(L / S) / self.N) * self.N
            for hq in range(Hq):
                h = hq // G
                if self.round_keys:
                    x = (_bf16(c0[f["key_codes"][:, h]] * kn[:, h, None]) @ q[b, hq]) * np.float32(scale * LOG2E)
                else:
                    x = (c[f["key_codes"][:, h]] @ q[b, hq]) * kn[:, h] * np.float32(scale * LOG2E)
                parts = [self._split(x, codes[:, h], vs[:, h], vz[:, h], st, min(st + W, L))
                         for st in range(0, L, W)]
                lse = np.array([lse for _, lse in parts])
                w = np.exp(lse - lse.max())
                out[b, hq] = sum(wi * o for wi, (o, _) in zip(w, parts)) / w.sum()
        return out.astype(np.float32).astype(ml_dtypes.bfloat16)

    def _split(self, x, codes, vs, vz, start, end):
        m, acc, z, l = -np.inf, 0.0, 0.0, 0.0
        for t0 in range(start, end, self.N):
            t = slice(t0, min(t0 + self.N, end))
            m_new = max(m, x[t].max())
            if m_new - m > 8:  # the kernel's lazy running max (TAU = 8)
                a = 0.0 if m == -np.inf else 2.0 ** (m - m_new)
                acc, z, l, m = acc * a, z * a, l * a, m_new
            pt = 2.0 ** (x[t] - m)
            l += pt.sum()
            if self.model:
                acc = acc + _bf16(pt) @ _bf16(codes[t] * vs[t, None] + vz[t, None])
                continue
            r = _bf16(pt * vs[t]) if self.round_ps else pt * vs[t]
            acc = acc + r @ (codes[t] - self.centre)
            z += (pt * (vz[t] + self.centre * vs[t])).sum()
        return (acc + z) / l, (m + np.log2(l)) * math.log(2)


VARIANTS = {"kernel (80aa210 defaults)": {}, "kernel (116211e defaults)": dict(programs_per_sm=8, block_n=32),
            "P * s in fp32": dict(round_ps=False), "centred codes": dict(centre=7.5), "fp32 queries": dict(round_q=False),
            "one split": dict(splits=False), "keys rounded as products": dict(round_keys=True),
            "act-mma's roundings": dict(model=True)}


def main(argv=None) -> int:
    from conformance import families
    from conformance.memo import Memo
    from conformance.run.selection import select_cells

    argv = sys.argv[1:] if argv is None else argv
    pattern = argv[0] if argv else FAILED
    fam = families.get("turboquant")
    cells = [c for c in select_cells("full", "turboquant") if pattern in c.id and c.op == "decode"
             and c["preset"] == "turboquant_4bit_nc" and c["layout"] == "soa" and c.get("act") == "bfloat16"]
    for cell in cells:
        print(cell.id)
        inputs, memo = fam.make_inputs(cell), Memo()
        print(f"  {'':28} {'act-mma-table':>24}  {'act-mma':>24}")
        for name, kw in VARIANTS.items():
            out = fam.run_with(Emulation(**kw), cell, inputs)
            cols = [fam.check(cell, m, inputs, out, memo).worst().metrics for m in ("act-mma-table", "act-mma")]
            print(f"  {name:28}" + "".join(f"  margin {w['margin']:6.3f} max_abs {w['max_abs']:.4f}" for w in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
