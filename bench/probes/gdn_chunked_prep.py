"""The GPU chunked prefill's prep kernel variants (``optimized.triton.gdn_chunked.stages``' prep_* arguments)
timed beside the default at the ``gdn/chunked-gpu`` shapes, with FLA's ``chunk_gated_delta_rule`` in a CUDA graph
in the same run (ms: the median of ``SAMPLES`` CUDA-graph samples, their min and max kept). Per variant and
shape: the stages before the state pass (the prep kernel, and the readout kernel unless the variant computes
the readout operands itself), the prep kernel alone, and the whole prefill; the pre-state stages do not read
the pool, so they are timed at the bf16 pools' shapes only. Before timing, each variant's output and pool are
compared with the default's: "bitwise", or max |diff| over max |x| (a few bf16 ulps where a variant's fp32
sums round an operand the other way). The variants are first compiled in ``--compile-workers`` processes at
once (Triton's on-disk cache then serves the timing process); then FLA at every shape, then variant by
variant (the likeliest first) at every shape; past ``--budget`` seconds (counted from the start) the
remaining variants are skipped. Each step catches its failure, prints it whole and goes on. Writes
``gdn_chunked_prep.json``; the table is printed last:

    python -m bench.probes.gdn_chunked_prep --out DIR [--shapes LABEL ...] [--variants NAME ...] [--budget S]
        [--compile-workers N]
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from bench.probes.common import measure_rows
from bench.probes.gdn_chunked_variants import _diff, _staged

SAMPLES = 3     # CUDA-graph samples a timing (``bench.timing.cuda_graph``): median, min and max kept
SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
          "varlen=4x2048,state=float32")
# the "tiles" prep kernel's plain form: one value head a program, the readout kernel beside it, the solve in
# 16-row blocks, divided norms, 4 warps
PLAIN = dict(prep_heads=1, prep_readout=False, prep_form="blocks", prep_norm="div", prep_warps=4)
# name: the ``stages`` keywords beside PLAIN
_BESIDE_PLAIN = {     # the likeliest first: past the budget the rest is skipped
    "plain": {},
    "heads2 readout": dict(prep_heads=2, prep_readout=True),
    "heads2 readout w8": dict(prep_heads=2, prep_readout=True, prep_warps=8),
    "heads2 readout rcp w8": dict(prep_heads=2, prep_readout=True, prep_norm="rcp", prep_warps=8),
    "heads2 readout batched w8": dict(prep_heads=2, prep_readout=True, prep_form="batched", prep_warps=8),
    "readout": dict(prep_readout=True),
    "readout w8 r128": dict(prep_readout=True, prep_warps=8, prep_registers=128),
    "heads2 readout w8 r128": dict(prep_heads=2, prep_readout=True, prep_warps=8, prep_registers=128),
    "r168": dict(prep_registers=168),
    "readout w8": dict(prep_readout=True, prep_warps=8),
    "readout rcp w8": dict(prep_readout=True, prep_norm="rcp", prep_warps=8),
    "heads2": dict(prep_heads=2),
    "heads2 w8": dict(prep_heads=2, prep_warps=8),
    "rcp": dict(prep_norm="rcp"),
    "batched": dict(prep_form="batched"),
    "w8": dict(prep_warps=8),
}
# "default": the module's defaults
VARIANTS = {"default": {}, **{name: {**PLAIN, **kw} for name, kw in _BESIDE_PLAIN.items()}}


def _samples(fn) -> tuple[float, float, float]:
    """(median, min, max) ms of ``SAMPLES`` CUDA-graph samples of ``fn``."""
    import numpy as np

    from bench import timing

    ms = timing.cuda_graph(fn, SAMPLES) * 1e3
    return float(np.median(ms)), float(np.min(ms)), float(np.max(ms))


def timing_step(rows: list, width: int):
    """A ``step(label, name, quantity, fn)`` that times ``fn()`` (``_samples``), appends (label, name, quantity,
    median, [min, max]) to ``rows`` and prints it (``name`` ``width`` wide); a failure is printed whole and
    appended as "failed"."""
    def step(label, name, quantity, fn):
        try:
            value, lo, hi = _samples(fn())
            rows.append((label, name, quantity, value, [lo, hi]))
            print(f"{label:30} {name:{width}} {quantity:10} {value:.4f} ({lo:.4f}-{hi:.4f})", flush=True)
        except Exception:
            print(f"{label} {name} {quantity}: FAILED\n{traceback.format_exc()}", flush=True)
            rows.append((label, name, quantity, "failed", None))
    return step


def fla_rows(step, shapes: dict, inputs: dict) -> None:
    """FLA's ``chunk_gated_delta_rule`` of the ``gdn/chunked-gpu`` bench timed whole at every shape (``step``)."""
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    fla = registry.impls(CHUNKED_BENCH)["fla"]
    for label, x in inputs.items():
        step(label, "fla", "whole", lambda: fla.prepare(shapes[label], x))


def _pre_state(launches: dict):
    """The launches before the state pass, as one callable."""
    before = [launch for name, launch in launches.items() if name in ("prep", "readout")]

    def run():
        for launch in before:
            launch()
    return run


def _compile(name: str, labels: list) -> str:
    """Run variant ``name`` once at each shape of ``labels`` (its kernels compiled into Triton's on-disk cache);
    what failed, or "" (run in a worker process of ``precompile``)."""
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH, chunked_inputs
    from optimized.triton import gdn_chunked

    registry.load()
    shapes = registry.benches()[CHUNKED_BENCH].shapes
    failed = ""
    for label in labels:
        try:
            x = chunked_inputs(shapes[label])
            _staged(gdn_chunked, x, x["state"].clone(), **VARIANTS[name])
        except Exception as exc:
            failed += f"{label}: {type(exc).__name__}: {exc}\n"
    return failed


def precompile(names: list, labels: list, workers: int) -> None:
    """Compile the variants ``names`` at the shapes ``labels`` in ``workers`` processes at once, so that the
    timing process finds every kernel in Triton's cache; failures are printed (the timing process meets them
    again and records them)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.monotonic()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name, failed in zip(names, pool.map(_compile, names, [labels] * len(names))):
            if failed:
                print(f"precompile {name}: FAILED\n{failed}", flush=True)
    print(f"precompiled {len(names)} variants in {workers} processes: {time.monotonic() - t0:.1f} s", flush=True)


def measure(shapes: dict, variants: dict, rows: list, deadline: float, save) -> None:
    """Append (shape label, variant, quantity, value, [min, max] of a timing's samples or None) rows to
    ``rows`` as they are measured (a timing's value: its median, ms): FLA at every shape,
    then variant by variant (past ``deadline`` the rest skipped) every shape; ``save()`` after each variant."""
    import torch

    from bench.gdn_gpu import chunked_inputs
    from optimized.triton import gdn_chunked

    step = timing_step(rows, 26)
    inputs = {label: chunked_inputs(shape) for label, shape in shapes.items()}
    fla_rows(step, shapes, inputs)
    refs = {}
    for name, config in variants.items():
        if time.monotonic() > deadline:
            print(f"{name}: skipped (past the budget)", flush=True)
            continue
        for label, x in inputs.items():
            try:
                pool = x["state"].clone()
                out, whole, launches = _staged(gdn_chunked, x, pool, **config)
            except Exception:
                print(f"{label} {name}: FAILED\n{traceback.format_exc()}", flush=True)
                rows.append((label, name, "check", "failed", None))
                continue
            if name == "default":
                refs[label] = (out.clone(), pool.clone())
                same = "reference"
            elif label not in refs:
                same = "no reference"
            elif torch.equal(out, refs[label][0]) and torch.equal(pool, refs[label][1]):
                same = "bitwise"
            else:
                same = f"{_diff(out, refs[label][0])} / {_diff(pool, refs[label][1])}"
            rows.append((label, name, "check", same, None))
            print(f"{label:30} {name:26} {'check':10} {same}", flush=True)
            if "bfloat16" in label:
                step(label, name, "pre-state", lambda: _pre_state(launches))
                step(label, name, "prep", lambda: launches["prep"])
            step(label, name, "whole", lambda: whole)
        save()


def ms_cell(v) -> str:
    """A table cell of a row's value: ms to four places, else what the row holds ("failed", a check) or "-"."""
    return f"{v:9.4f}" if isinstance(v, float) else f"{'-' if v is None else v:>9}"


def spread_lines(rows: list) -> list[str]:
    """The line under a table of ``timing_step`` rows: (max - min) / median over the timings, the largest and the
    median ([] without timings)."""
    spreads = [(hi - lo) / v for *_, v, spread in rows if spread for lo, hi in [spread]]
    if not spreads:
        return []
    return [f"medians of {SAMPLES} samples; (max - min) / median over the timings: largest "
            f"{100 * max(spreads):.2f}%, median {100 * sorted(spreads)[len(spreads) // 2]:.2f}%"]


def table(rows: list, labels: list, variants: list) -> list[str]:
    """One line per variant: the times per shape (ms) and the whole as a multiple of FLA's graph; then the
    checks against the default."""
    value = {(label, name, q): v for label, name, q, v, _ in rows}
    short = {label: label.replace("varlen=", "").replace("T=8192", "1x8192").replace(",state=", " ")
             .replace("bfloat16", "bf16").replace("float32", "fp32") for label in labels}
    bf16 = {label: "bfloat16" in label for label in labels}
    lines = [f"{'ms, CUDA-graph median':26}" + "".join(f" | {short[label]:>36}" if bf16[label]
                                                        else f" | {short[label]:>16}" for label in labels),
             f"{'variant':26}" + "".join(f" | {'pre-state':>9} {'prep':>9} {'whole':>9} {'/FLA':>6}" if bf16[label]
                                         else f" | {'whole':>9} {'/FLA':>6}" for label in labels)]
    for name in ["fla"] + variants:
        line = f"{name:26}"
        for label in labels:
            fla, whole = value.get((label, "fla", "whole")), value.get((label, name, "whole"))
            ratio = f"{whole / fla:5.2f}x" if isinstance(whole, float) and isinstance(fla, float) else f"{'-':>6}"
            pre = f" {ms_cell(value.get((label, name, 'pre-state')))} {ms_cell(value.get((label, name, 'prep')))}" \
                if bf16[label] else ""
            line += f" |{pre} {ms_cell(whole)} {ratio}"
        lines.append(line)
    lines += spread_lines(rows)
    lines += ["", f"{'variant':26} output / pool against the default's"]
    for name in variants:
        lines.append(f"{name:26} " + "; ".join(f"{short[label]}: {value.get((label, name, 'check'), '-')}"
                                                for label in labels))
    return lines


def main(argv=None) -> int:
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="shape labels of gdn/chunked-gpu")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="names of VARIANTS (default first)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds after which the rest is skipped")
    ap.add_argument("--compile-workers", type=int, default=12,
                    help="processes compiling the variants before the timing (0: compile as they are timed)")
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

    def run(save):
        if args.compile_workers > 0:
            try:
                precompile(list(variants), args.shapes, args.compile_workers)
            except Exception:
                print(f"precompile: FAILED\n{traceback.format_exc()}", flush=True)
        measure({label: shapes[label] for label in args.shapes}, variants, rows, deadline, save)

    measure_rows(out / "gdn_chunked_prep.json", rows, run)
    print()
    for line in table(rows, args.shapes, list(variants)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
