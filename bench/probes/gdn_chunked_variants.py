"""The GPU chunked prefill's configurations timed side by side at the ``gdn/chunked-gpu`` shapes (CUDA-graph
medians, ms): ours whole and stage by stage (``optimized.triton.gdn_chunked.stages``) with the output read out in
the state pass and after it; the state pass alone at other V-tiles, warps and pipeline stages, each prep kernel
at 4 and 8 warps, and the fastest of them together (at the bf16 pools' shapes unless ``--sweep``); another
version of the module (``--baseline PATH``, e.g. an older ``gdn_chunked.py``) whole and by stage; FLA's
``chunk_gated_delta_rule`` in a CUDA graph and launched eagerly. Before timing, each configuration's output and
pool are compared with the baseline's (max |diff| over max |x|; the same rounding points give differences of a
few bf16 ulps from the fp32 sums' order only). Each step catches its failure, prints it whole and goes on.
Writes ``gdn_chunked_variants.json``; the table is printed last:

    python -m bench.probes.gdn_chunked_variants --out DIR [--baseline PATH] [--shapes LABEL ...] [--sweep TEXT]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
from pathlib import Path

import numpy as np

from bench.probes.common import Stopped, stop_on_term

SHAPES = ("T=8192,state=bfloat16", "varlen=4x2048,state=bfloat16", "T=8192,state=float32",
          "varlen=4x2048,state=float32")
# (readout, V-tile, warps, pipeline stages) of the state pass timed alone beside the default
STATE_CONFIGS = ((True, 16, 4, 1), (True, 16, 4, 2), (True, 16, 8, 2), (True, 32, 4, 1), (True, 32, 4, 3),
                 (True, 32, 8, 2), (True, 64, 4, 1), (True, 64, 4, 2), (True, 64, 8, 2), (True, 64, 8, 3),
                 (False, 16, 4, 2), (False, 32, 8, 2), (False, 64, 8, 2))


def _load(path: str):
    spec = importlib.util.spec_from_file_location("baseline_gdn_chunked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(x: dict) -> list:
    return [x[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]


def _ms(fn, eager: bool = False) -> float:
    from bench import timing

    return float(np.median((timing.cuda_events if eager else timing.cuda_graph)(fn, 1))) * 1e3


def _staged(module, x: dict, pool, **config):
    """(whole, {stage: launch}) of ``module.stages`` on the inputs ``x`` with ``pool``, every stage run once."""
    out, launches = module.stages(*_args(x), pool, x["state_indices"], **config)
    for _, launch in launches:
        launch()

    def whole():
        for _, launch in launches:
            launch()
    return out, whole, dict(launches)


def _diff(a, b) -> str:
    d = (a.float() - b.float()).abs().max().item()
    return f"{d / max(b.float().abs().max().item(), 1e-30):.2e}"


def _step(rows: list, label: str, name: str, what):
    """Append (label, name, value) where ``what()`` gives the value; on failure print the traceback, record it."""
    try:
        value = what()
    except Exception:
        print(f"{label} {name}: FAILED\n{traceback.format_exc()}", flush=True)
        value = "failed"
    rows.append((label, name, value))
    print(f"{label:30} {name:34} {value if isinstance(value, str) else f'{value:.4f}'}", flush=True)
    return value


def shape_rows(label: str, shape: dict, baseline, rows: list, sweep: bool) -> None:
    """Append the rows of one shape to ``rows`` as they are measured; the prep kernels' and the state pass's
    configurations where ``sweep``."""
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH, chunked_inputs
    from optimized.triton import gdn_chunked

    x = chunked_inputs(shape)
    pool0 = x["state"].clone()
    peers = registry.impls(CHUNKED_BENCH)
    for name, eager in (("fla", False), ("fla-eager", True)):
        _step(rows, label, name, lambda: _ms(peers["fla"].prepare(shape, x), eager))
    ref = None
    if baseline is not None:
        pool = pool0.clone()
        try:
            out, whole, launches = _staged(baseline, x, pool)
            ref = (out.clone(), pool.clone())
            _step(rows, label, "baseline", lambda: _ms(whole))
            for stage, launch in launches.items():
                _step(rows, label, f"baseline {stage}", lambda: _ms(launch))
        except Exception:
            print(f"{label} baseline: FAILED\n{traceback.format_exc()}", flush=True)
    for readout in (True, False):
        tag = "ours" if readout == gdn_chunked.READOUT else f"ours readout={readout}"
        pool = pool0.clone()
        try:
            out, whole, launches = _staged(gdn_chunked, x, pool, readout=readout)
            if ref is not None:
                rows.append((label, f"{tag} o / pool vs baseline", f"{_diff(out, ref[0])} / {_diff(pool, ref[1])}"))
                print(f"{label:30} {rows[-1][1]:34} {rows[-1][2]}", flush=True)
            _step(rows, label, tag, lambda: _ms(whole))
            for stage, launch in launches.items():
                _step(rows, label, f"{tag} {stage}", lambda: _ms(launch))
        except Exception:
            print(f"{label} {tag}: FAILED\n{traceback.format_exc()}", flush=True)
    if not sweep:
        return

    def stage_ms(stage, **config):
        """The stage alone under ``config``, after its output and pool were compared with the baseline's."""
        pool = pool0.clone()
        out, _, launches = _staged(gdn_chunked, x, pool, **config)
        if ref is not None:
            d = max(float(_diff(out, ref[0])), float(_diff(pool, ref[1])))
            if not d < 1e-2:
                raise ValueError(f"o or pool differs from the baseline's by {d:.2e} of its largest value")
        return _ms(launches[stage])

    preps = {}
    for prep in gdn_chunked.PREP_KERNELS:
        for warps in (4, 8):
            preps[(prep, warps)] = _step(rows, label, f"prep {prep} w{warps}",
                                         lambda: stage_ms("prep", prep=prep, prep_warps=warps))
    states = {}
    for readout, bv, warps, stages in STATE_CONFIGS:
        states[(readout, bv, warps, stages)] = _step(
            rows, label, f"state readout={int(readout)} bv{bv} w{warps} s{stages}",
            lambda: stage_ms("state", readout=readout, state_block_v=bv, state_warps=warps, state_stages=stages))
    # the fastest prep and, per readout mode, the fastest state pass (the defaults among them), run together
    timed = {k: v for k, v in preps.items() if not isinstance(v, str)}
    if not timed:
        return
    prep, prep_warps = min(timed, key=timed.get)
    for readout in (True, False):
        own = {k: v for k, v in states.items() if k[0] == readout and not isinstance(v, str)}
        default = next((r for l_, n, r in rows[::-1] if l_ == label and n == ("ours state" if readout ==
                        gdn_chunked.READOUT else f"ours readout={readout} state")), None)
        if isinstance(default, float):
            own[(readout, gdn_chunked.STATE_BV, gdn_chunked.WARPS, gdn_chunked.STATE_STAGES)] = default
        if not own:
            continue
        _, bv, warps, stages = min(own, key=own.get)
        config = dict(readout=readout, prep=prep, prep_warps=prep_warps, state_block_v=bv, state_warps=warps,
                      state_stages=stages)

        def best_ms():
            pool = pool0.clone()
            out, whole, _ = _staged(gdn_chunked, x, pool, **config)
            return _ms(whole)
        _step(rows, label, f"best readout={int(readout)}: prep {prep} w{prep_warps}, state bv{bv} w{warps} "
                           f"s{stages}", best_ms)


def main(argv=None) -> int:
    from bench import registry
    from bench.gdn_gpu import CHUNKED_BENCH

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", help="another gdn_chunked.py timed and compared beside this one")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="shape labels of gdn/chunked-gpu")
    ap.add_argument("--sweep", default="state=bfloat16",
                    help="time the prep and state configurations at the shapes whose label holds this text")
    args = ap.parse_args(argv)
    registry.load()
    shapes = registry.benches()[CHUNKED_BENCH].shapes
    baseline = None
    if args.baseline:
        try:
            baseline = _load(args.baseline)
        except Exception:
            print(f"baseline {args.baseline}: FAILED\n{traceback.format_exc()}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    stop_on_term()   # a ``timeout`` still gets the table of what was measured
    try:
        for label in args.shapes:
            try:
                shape_rows(label, shapes[label], baseline, rows, sweep=args.sweep in label)
            except Exception:
                print(f"{label}: FAILED\n{traceback.format_exc()}", flush=True)
            (out / "gdn_chunked_variants.json").write_text(json.dumps(rows, indent=1) + "\n")
    except Stopped:
        print("stopped by SIGTERM: the table holds the shapes finished before it", flush=True)
    print(f"\n{'shape':30} {'configuration':34} ms (or o / pool difference)")
    for label, name, value in rows:
        print(f"{label:30} {name:34} {value if isinstance(value, str) else f'{value:.4f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
