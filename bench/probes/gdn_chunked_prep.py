"""The GPU chunked prefill's prep kernel variants (``optimized.triton.gdn_chunked.stages``' prep_* arguments)
timed beside the default at the ``gdn/chunked-gpu`` shapes, with FLA's ``chunk_gated_delta_rule`` in a CUDA graph
in the same run (CUDA-graph medians, ms). Per variant and shape: the stages before the state pass (the prep
kernel, and the readout kernel unless the variant computes the readout operands itself), the prep kernel alone,
and the whole prefill; the pre-state stages do not read the pool, so they are timed at the bf16 pools' shapes
only. Before timing, each variant's output and pool are compared with the default's: "bitwise", or max |diff|
over max |x| (a few bf16 ulps where a variant's fp32 sums round an operand the other way). Each step catches
its failure, prints it whole and goes on; past ``--budget`` seconds the rest is skipped. Writes
``gdn_chunked_prep.json``; the table is printed last:

    python -m bench.probes.gdn_chunked_prep --out DIR [--shapes LABEL ...] [--variants NAME ...] [--budget S]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path

from bench.probes.gdn_chunked_variants import _diff, _ms, _staged

SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
          "varlen=4x2048,state=float32")
# name: the ``stages`` keywords beside the defaults ("tf32" rounds the solve's operands outside the model)
VARIANTS = {     # the likeliest first: past the budget the rest is skipped
    "default": {},
    "heads2 readout": dict(prep_heads=2, prep_readout=True),
    "heads2 readout w8": dict(prep_heads=2, prep_readout=True, prep_warps=8),
    "heads2 readout rcp w8": dict(prep_heads=2, prep_readout=True, prep_norm="rcp", prep_warps=8),
    "readout": dict(prep_readout=True),
    "readout w8": dict(prep_readout=True, prep_warps=8),
    "readout rcp w8": dict(prep_readout=True, prep_norm="rcp", prep_warps=8),
    "heads2": dict(prep_heads=2),
    "heads2 w8": dict(prep_heads=2, prep_warps=8),
    "rcp": dict(prep_norm="rcp"),
    "tf32x3": dict(prep_solve="tf32x3"),
    "tf32 (outside model)": dict(prep_solve="tf32"),
    "w8": dict(prep_warps=8),
}


def _pre_state(launches: dict):
    """The launches before the state pass, as one callable."""
    before = [launch for name, launch in launches.items() if name in ("prep", "readout")]

    def run():
        for launch in before:
            launch()
    return run


def shape_rows(label: str, shape: dict, variants: dict, rows: list, deadline: float) -> None:
    """Append (label, variant, quantity, value) rows of one shape to ``rows`` as they are measured."""
    import torch

    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH, chunked_inputs
    from optimized.triton import gdn_chunked

    def step(name, quantity, what):
        try:
            value = what()
        except Exception:
            print(f"{label} {name} {quantity}: FAILED\n{traceback.format_exc()}", flush=True)
            value = "failed"
        rows.append((label, name, quantity, value))
        print(f"{label:30} {name:24} {quantity:10} {value if isinstance(value, str) else f'{value:.4f}'}",
              flush=True)

    x = chunked_inputs(shape)
    pool0 = x["state"].clone()
    step("fla", "whole", lambda: _ms(registry.impls(CHUNKED_BENCH)["fla"].prepare(shape, x)))
    ref = None
    for name, config in variants.items():
        if time.monotonic() > deadline:
            print(f"{label} {name}: skipped (past the budget)", flush=True)
            continue
        try:
            pool = pool0.clone()
            out, whole, launches = _staged(gdn_chunked, x, pool, **config)
        except Exception:
            print(f"{label} {name}: FAILED\n{traceback.format_exc()}", flush=True)
            rows.append((label, name, "check", "failed"))
            continue
        if ref is None:
            ref = (out.clone(), pool.clone())
            same = "reference"
        elif torch.equal(out, ref[0]) and torch.equal(pool, ref[1]):
            same = "bitwise"
        else:
            same = f"{_diff(out, ref[0])} / {_diff(pool, ref[1])}"
        rows.append((label, name, "check", same))
        print(f"{label:30} {name:24} {'check':10} {same}", flush=True)
        if "bfloat16" in label:
            step(name, "pre-state", lambda: _ms(_pre_state(launches)))
            step(name, "prep", lambda: _ms(launches["prep"]))
        step(name, "whole", lambda: _ms(whole))


def table(rows: list, labels: list, variants: list) -> list[str]:
    """One line per variant: the times per shape (ms) and the whole as a multiple of FLA's graph; then the
    checks against the default."""
    value = {(label, name, q): v for label, name, q, v in rows}

    def ms(v):
        return f"{v:9.4f}" if isinstance(v, float) else f"{'-' if v is None else v:>9}"
    short = {label: label.replace("varlen=", "").replace("T=8192", "1x8192").replace(",state=", " ")
             .replace("bfloat16", "bf16").replace("float32", "fp32") for label in labels}
    bf16 = {label: "bfloat16" in label for label in labels}
    lines = [f"{'ms, CUDA-graph medians':24}" + "".join(f" | {short[label]:>36}" if bf16[label]
                                                        else f" | {short[label]:>16}" for label in labels),
             f"{'variant':24}" + "".join(f" | {'pre-state':>9} {'prep':>9} {'whole':>9} {'/FLA':>6}" if bf16[label]
                                         else f" | {'whole':>9} {'/FLA':>6}" for label in labels)]
    for name in ["fla"] + variants:
        line = f"{name:24}"
        for label in labels:
            fla, whole = value.get((label, "fla", "whole")), value.get((label, name, "whole"))
            ratio = f"{whole / fla:5.2f}x" if isinstance(whole, float) and isinstance(fla, float) else f"{'-':>6}"
            pre = f" {ms(value.get((label, name, 'pre-state')))} {ms(value.get((label, name, 'prep')))}" \
                if bf16[label] else ""
            line += f" |{pre} {ms(whole)} {ratio}"
        lines.append(line)
    lines += ["", f"{'variant':24} output / pool against the default's"]
    for name in variants:
        lines.append(f"{name:24} " + "; ".join(f"{short[label]}: {value.get((label, name, 'check'), '-')}"
                                                for label in labels))
    return lines


class _Stopped(BaseException):
    pass


def _stop(signum, frame):
    raise _Stopped()


def main(argv=None) -> int:
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="shape labels of gdn/chunked-gpu")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="names of VARIANTS (default first)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds after which the rest is skipped")
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        print(f"--variants: unknown {unknown}; expected names of {list(VARIANTS)}")
        return 2
    registry.load()
    shapes = registry.benches()[CHUNKED_BENCH].shapes
    bad = [label for label in args.shapes if label not in shapes]
    if bad:
        print(f"--shapes: unknown {bad}; expected labels of {sorted(shapes)}")
        return 2
    variants = {name: VARIANTS[name] for name in ["default"] + [v for v in args.variants if v != "default"]}
    deadline = time.monotonic() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    signal.signal(signal.SIGTERM, _stop)        # a ``timeout`` still gets the table of what was measured
    try:
        for label in args.shapes:
            try:
                shape_rows(label, shapes[label], variants, rows, deadline)
            except Exception:
                print(f"{label}: FAILED\n{traceback.format_exc()}", flush=True)
            (out / "gdn_chunked_prep.json").write_text(json.dumps(rows, indent=1) + "\n")
    except _Stopped:
        print("stopped by SIGTERM: the table holds what was measured before it", flush=True)
    print()
    for line in table(rows, args.shapes, list(variants)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
