"""Tile configurations of our GDN decode (``optimized.triton.gdn_recurrent.decode``: V-tile BV and
warps) beside the registry's ``gdn/decode-gpu`` bench (our default, the peers, the copy ceiling), in
the same run; registered for this run only. Writes ``gdn_decode_gpu_configs.json`` (perf-JSON records) and
prints ms and % of copy: ``python -m bench.probes.gdn_decode_configs --out DIR [--shapes LABEL ...]`` (on a GPU)."""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

CONFIGS = {f"bv{bv}-w{w}": dict(block_v=bv, num_warps=w) for bv in (16, 32, 64) for w in (2, 4, 8)}


def main(argv=None) -> int:
    from bench import registry, run
    from bench.gdn_gpu import BENCH, ours
    from bench.machine import gpu_capability
    from bench.measure import measure
    from bench.registry import Impl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="*", help="shape labels of the bench (default all)")
    args = ap.parse_args(argv)
    impls = [Impl(bench=BENCH, name=f"triton-gdn-{n}", role="ours", prepare=functools.partial(ours, **kw),
                  available=gpu_capability) for n, kw in CONFIGS.items()]
    registry.load()
    with registry.registered(*impls):
        records = {r.rid: r for r in measure(BENCH, shapes=args.shapes)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gdn_decode_gpu_configs.json").write_text(json.dumps(run.perf_json(records, []), indent=1) + "\n")
    for rid, r in records.items():
        if r.skip:
            print(f"{rid:70} skip: {r.skip[:100]}")
            continue
        t = r.extra_info["time_s"]["median"]
        print(f"{rid:70} {t * 1e3:8.4f} ms  {100 * r.extra_info['fraction_of'].get('gpu-copy', 0):6.1f}% copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
