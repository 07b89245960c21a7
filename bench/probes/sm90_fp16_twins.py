"""The float16 twins of the full turboquant tier's cells that ``triton-sm90`` runs (the same shapes and
seeds with ``act=float16``: the tier itself has few float16 cells of that preset and layout), judged by the
family's check under the model of ``triton-sm90`` (act-mma-table) and the configurations of ``sm90_variants``, in the
runner's worker processes. Writes ``sm90_fp16_twins_cells.jsonl`` and prints the counts:
``python -m bench.probes.sm90_fp16_twins --out DIR [--jobs N]`` (on an sm_90 GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

BACKENDS = ("triton-sm90", "triton-sm90-fp16-integer", "triton-sm90-regs")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args(argv)
    os.environ["KERNEL_LAB_BACKEND_MODULES"] = "bench.probes.sm90_variants"
    from bench.probes.sm90_variants import fp16_twins
    from conformance import fingerprint, registry
    from conformance.run.runner import run_in_workers, select_cells

    default = registry.get("triton-sm90")
    cells = fp16_twins([c for c in select_cells("full", "turboquant") if default.skip_reason(c) is None])
    backends = [registry.get(n) for n in BACKENDS]
    recs = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sm90_fp16_twins_cells.jsonl", "w") as f:
        def emit(rec):
            recs.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
        run_in_workers([(c, [b for b in backends if b.skip_reason(c) is None]) for c in cells], args.jobs, emit,
                       devices=fingerprint.devices())
    counts = {b: dict(Counter(r["status"] for r in recs if r["backend"] == b)) for b in BACKENDS}
    margins = {b: max((r.get("metrics", {}).get("margin") or 0.0 for r in recs if r["backend"] == b
                       and r["status"] == "pass"), default=None) for b in BACKENDS}
    print(f"{len(cells)} float16 twin cells")
    for b in BACKENDS:
        print(f"{b:28} {counts[b]} largest margin of a pass {margins[b]}")
    for r in recs:
        if r["status"] != "pass":
            print("NOT PASS", r["backend"], r["status"], r["id"], str(r.get("reason"))[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
