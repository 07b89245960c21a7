"""Configurations of the Triton TurboQuant decodes beside the registry's ``turboquant/decode``
bench (the default grouped decode, SDPA, the ceilings), in the same run: the grouped decode with
the pair table, BLOCK_N 64, 8 warps, 2 or 8 splits; the split-KV decode (exact); unified attention
as decode. Registered for this run only. Writes ``tq_decode_variants.json`` (the perf-JSON records):
``python -m bench.probes.decode_variants --out DIR [--quick]`` (on a GPU; ``--quick``:
L=8192 and the grouped variants only)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

VARIANTS = {"grouped-keys-pair": dict(keys="pair"), "grouped-keys-gather-n64": dict(keys="gather", block_n=64),
            "grouped-keys-pair-n64": dict(keys="pair", block_n=64), "grouped-w8": dict(num_warps=8),
            "grouped-s2": dict(num_kv_splits=2), "grouped-s8": dict(num_kv_splits=8)}


def _unified(shape, inputs):
    import torch

    from optimized.triton.tq_unified import unified_attention

    qsl = torch.arange(shape["B"] + 1, dtype=torch.int32, device="cuda")
    return lambda: unified_attention(inputs["query"], inputs["cache"], inputs["block_table"], qsl,
                                     inputs["seq_lens"], 1, preset=shape["preset"], rotation=inputs["rotation"])


def variants(quick: bool):
    from bench.machine import gpu_capability
    from bench.registry import Impl
    from bench.turboquant_gpu import grouped, launcher

    def split():
        from optimized.triton.tq_decode_split import decode_split
        return decode_split

    out = [Impl(bench="turboquant/decode", name=n, role="ours", prepare=launcher(grouped, **kw),
                available=gpu_capability) for n, kw in VARIANTS.items()]
    if not quick:
        out.append(Impl(bench="turboquant/decode", name="split-exact", role="ours", prepare=launcher(split),
                        available=gpu_capability))
        out.append(Impl(bench="turboquant/decode", name="unified-bf16", role="ours", prepare=_unified,
                        available=gpu_capability))
    return out


def main(argv=None) -> int:
    from bench import registry, run
    from bench.measure import measure
    from bench.probes.common import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for tq_decode_variants.json")
    ap.add_argument("--quick", action="store_true", help="L=8192, grouped variants only")
    args = ap.parse_args(argv)
    with registry.registered(*variants(args.quick)):
        records = {r.rid: r for r in measure("turboquant/decode", ["L=8192"] if args.quick else None)}
    for rid, r in records.items():
        info = r.extra_info
        line = r.skip or f"{info['time_s']['median'] * 1e3:8.4f} ms {info['gbps']:8.1f} GB/s " + " ".join(
            f"{k} {v:.3f}" for k, v in info["fraction_of"].items())
        print(f"{rid:50} {line}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "tq_decode_variants.json", run.perf_json(records, []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
