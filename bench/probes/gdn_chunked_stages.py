"""The registry's ``gdn/chunked-gpu`` bench (ours, FLA and vLLM in CUDA graphs and eager, the copy and matmul
ceilings) with each of our stages (``optimized.triton.gdn_chunked.stages``: prep, readout, state; the state pass
also at other V-tiles and warps) timed alone beside it, in the same run; the stages are registered for this
run only. Writes ``gdn_chunked_gpu.json`` (perf-JSON records, the commit and date given) and prints, per shape,
ms, % of the bf16 matmul peak, % of copy (the copy's time over the row's) and ours / FLA:

    python -m bench.probes.gdn_chunked_stages --out DIR [--shapes LABEL ...] [--commit SHA]   (on a GPU)
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

STAGES = ("prep", "readout", "state")
# other (V-tile, warps) of the state pass, timed alone beside the default
STATE_CONFIGS = ((16, 4), (64, 8), (32, 8))


def _stage(name: str, **config):
    def prepare(shape, inputs):
        from optimized.triton.gdn_chunked import stages

        x = inputs
        _, launches = stages(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], x["state"],
                             x["state_indices"], **config)
        for _, launch in launches:      # the buffers the stage reads hold what the stages before it wrote
            launch()
        return dict(launches)[name]
    return prepare


def _median(r) -> float | None:
    return None if r is None or r.skip else r.extra_info["time_s"]["median"]


def table(records: dict, bench: str) -> list[str]:
    """One line per shape and implementation: ms, % matmul peak (TFLOP/s of the op over the ceiling's), % copy."""
    lines = []
    labels = sorted({rid[len(bench) + 1:].rsplit("/", 1)[0] for rid in records})
    for label in labels:
        row = {rid.rsplit("/", 1)[1]: r for rid, r in records.items() if rid.startswith(f"{bench}/{label}/")}
        copy, fla = _median(row.get("gpu-copy")), _median(row.get("fla"))
        peak = None if row.get("gpu-matmul-bf16") is None or row["gpu-matmul-bf16"].skip \
            else row["gpu-matmul-bf16"].extra_info["tflops"]
        for name, r in row.items():
            if r.skip:
                lines.append(f"{label:28} {name:28} skip: {r.skip[:90]}")
                continue
            t = _median(r)
            info = r.extra_info
            pk = f"{100 * info['tflops'] / peak:6.2f}% peak" if peak and r.extra_info["role"] != "ceiling" else ""
            cp = f"{100 * copy / t:6.1f}% copy" if copy and r.extra_info["role"] != "ceiling" else ""
            vs = f"{t / fla:5.2f}x FLA" if fla and name.startswith("triton-gdn") else ""
            lines.append(f"{label:28} {name:28} {t * 1e3:9.4f} ms {pk:13} {cp:12} {vs}")
    return lines


def summary(records: dict, bench: str) -> list[str]:
    """One line per shape: ms of ours, FLA and vLLM (CUDA-graph replays and eager), copy; ours / FLA (graph);
    ours' % of the matmul peak and of copy; the stages alone and the state pass's other configurations (ms)."""
    labels = sorted({rid[len(bench) + 1:].rsplit("/", 1)[0] for rid in records})
    lines = []
    for label in labels:
        row = {rid.rsplit("/", 1)[1]: r for rid, r in records.items() if rid.startswith(f"{bench}/{label}/")}
        ms = {n: (None if _median(r) is None else _median(r) * 1e3) for n, r in row.items()}
        ours, fla, copy = ms.get("triton-gdn"), ms.get("fla"), ms.get("gpu-copy")
        mm = row.get("gpu-matmul-bf16")
        peak = None if mm is None or mm.skip else mm.extra_info["tflops"]

        def f(x):
            return "-" if x is None else f"{x:.4f}"
        parts = [f"{label:28} ours {f(ours)} fla {f(fla)} (eager {f(ms.get('fla-eager'))}) "
                 f"vllm {f(ms.get('vllm-gdn'))} (eager {f(ms.get('vllm-gdn-eager'))}) copy {f(copy)}"]
        if ours and fla:
            parts.append(f"ours/fla {ours / fla:.3f}")
        if ours and peak:
            parts.append(f"peak {100 * row['triton-gdn'].extra_info['tflops'] / peak:.2f}%")
        if ours and copy:
            parts.append(f"copy {100 * copy / ours:.1f}%")
        parts.append("| " + " ".join(f"{s} {f(ms.get('triton-gdn-' + s))}" for s in STAGES))
        parts.append("| " + " ".join(f"bv{bv}w{w} {f(ms.get(f'triton-gdn-state-bv{bv}-w{w}'))}"
                                     for bv, w in STATE_CONFIGS))
        lines.append(" ".join(parts))
    return lines


def main(argv=None) -> int:
    from bench import registry, run
    from bench.gdn_gpu import CHUNKED_BENCH
    from bench.machine import gpu_capability
    from bench.measure import measure
    from bench.registry import Impl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="*", help="shape labels of the bench (default all)")
    ap.add_argument("--commit", default="unknown", help="the commit measured (recorded in the JSON)")
    args = ap.parse_args(argv)
    impls = [Impl(bench=CHUNKED_BENCH, name=f"triton-gdn-{s}", role="ours", prepare=_stage(s),
                  available=gpu_capability) for s in STAGES]
    impls += [Impl(bench=CHUNKED_BENCH, name=f"triton-gdn-state-bv{bv}-w{w}", role="ours",
                   prepare=_stage("state", state_block_v=bv, state_warps=w), available=gpu_capability)
              for bv, w in STATE_CONFIGS]
    registry.load()
    records = {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labels = args.shapes or sorted(registry.benches()[CHUNKED_BENCH].shapes, key=lambda s: "bfloat16" not in s)
    with registry.registered(*impls):
        every = registry.impls(CHUNKED_BENCH)
        own = [n for n, i in every.items() if i.role != "peer"]
        # shape by shape (the bf16 pools, those of the gates, first), the file rewritten and the shape's line
        # printed after each: a run cut short keeps what it measured. Ours and the ceilings first, then the
        # peers launched eagerly, then the peers in graphs: a peer that breaks the process's CUDA context (a
        # failed graph capture) loses only its rows
        eager = [n for n, i in every.items() if n not in own and i.timing == "events"]
        for label in labels:
            for names in (own, eager, [n for n in every if n not in own and n not in eager]):
                try:
                    records.update({r.rid: r for r in measure(CHUNKED_BENCH, shapes=[label], impls=names)})
                except Exception as exc:
                    print(f"{label}: measuring {names} raised {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            doc = run.perf_json(records, [])
            doc["measured"] = {"commit": args.commit,
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                               "command": "python -m bench.probes.gdn_chunked_stages --out DIR"}
            (out / "gdn_chunked_gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
            print("\n".join(summary({k: r for k, r in records.items() if f"/{label}/" in k}, CHUNKED_BENCH)),
                  flush=True)
    print("\n".join(table(records, CHUNKED_BENCH)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
