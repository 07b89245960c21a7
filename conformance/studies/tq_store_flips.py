"""`kernel-lab study tq-store-flips`: where a backend's TurboQuant store writes other cache bytes
than the NumPy reference store, and why.

For every store cell of a tier that the backend runs: the cache bytes that differ (of all bytes),
the key and value codes that differ (adjacent bucket or not), and for each flipped code its
quantizer input's distance to the nearest decision boundary over the fp32 rounding-error bound
(``turboquant.tolerances.tie_margins``: <= 1 is a tie, which the matrix forgives); the fp16 fields
(k_norm, v_scale, v_zero) that differ and by how many ulps at most.
"""
from __future__ import annotations

import os

import numpy as np

NAME = "tq-store-flips"
DESCRIPTION = "cache bytes and codes a backend's TurboQuant store writes differently from the NumPy store"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", required=True, help="a backend with the turboquant store op")
    parser.add_argument("--tier", default="ci", help="smoke, ci or full (default ci)")


def _cell_row(cell, backend) -> dict:
    from conformance.families import turboquant as tq
    from conformance.families.turboquant.tolerances import tie_margins
    from conformance.numerics import fp16_ordinal
    from conformance.run.inprocess import inputs_copy
    from reference.turboquant import numpy_ref
    from reference.turboquant.presets import preset as lookup

    inputs = tq.make_inputs(cell)
    got = np.asarray(backend.run(cell, inputs_copy(inputs))["kv_cache"])
    want = inputs["kv_cache"].copy()
    numpy_ref.store(want, inputs["key"], inputs["value"], inputs["slot_mapping"], inputs["preset"],
                    inputs["layout"], inputs["rotation"])
    p, slots = lookup(inputs["preset"]), inputs["slot_mapping"][inputs["slot_mapping"] >= 0]
    g = numpy_ref.read_fields(got, slots, p, inputs["layout"], cell["D"])
    w = numpy_ref.read_fields(want, slots, p, inputs["layout"], cell["D"])
    margins = tie_margins(inputs, p)
    row = {"id": cell.id, "cache_bytes": int(got.size), "diff_bytes": int(np.count_nonzero(got != want))}
    for name in ("key_codes", "value_codes"):
        flip = g[name] != w[name]
        step = np.abs(g[name].astype(np.int64) - w[name].astype(np.int64))[flip]
        m = margins[name][flip]
        row[name] = {"elements": int(flip.size), "flips": int(flip.sum()), "non_adjacent": int(np.sum(step != 1)),
                     "ties": int(np.sum(m <= 1.0)),
                     "max_margin": float(m.max()) if m.size and np.isfinite(m).all() else None}
    for name in ("k_norm", "v_scale", "v_zero"):
        if name in w:
            ulps = np.abs(fp16_ordinal(g[name]) - fp16_ordinal(w[name]))
            row[name] = {"differ": int(np.count_nonzero(ulps)), "max_ulps": int(ulps.max()) if ulps.size else 0}
    return row


def check(args) -> None:
    """The backend and tier by name, before any work (UsageError / ValueError naming them)."""
    from conformance import families, registry

    registry.get(args.backend)
    if args.tier not in families.TIERS:
        raise ValueError(f"--tier {args.tier!r}: expected one of {', '.join(families.TIERS)}")


def run(args) -> dict:
    from conformance import registry
    from conformance.families import turboquant as tq
    from conformance.run import probe

    backend = registry.get(args.backend)
    ok, why = probe.probe(backend)
    if not ok:
        raise SystemExit(f"{args.backend} unavailable: {why}")
    wrong = {k: v for k, v in backend.env.items() if os.environ.get(k) != v}
    if wrong:
        raise SystemExit(f"{args.backend} needs {wrong} in this process")
    cells = [c for c in tq.cells(args.tier) if c.op == "store" and backend.skip_reason(c) is None]
    rows = [_cell_row(c, backend) for c in cells]
    total, diff = sum(r["cache_bytes"] for r in rows), sum(r["diff_bytes"] for r in rows)
    return {"study": NAME, "backend": args.backend, "availability": why, "tier": args.tier, "cells": rows,
            "cache_bytes": total, "diff_bytes": diff, "diff_fraction": diff / total if total else 0.0}


def summarize(result: dict) -> str:
    lines = [f"{result['backend']} store vs the NumPy store, {result['tier']} tier: {result['diff_bytes']} of "
             f"{result['cache_bytes']} cache bytes differ ({100 * result['diff_fraction']:.4f}%)",
             f"{'key flips':>10} {'ties':>5} {'max margin':>10} {'val flips':>10} {'ties':>5} {'fp16 diff':>9}  cell"]
    for r in result["cells"]:
        k, v = r["key_codes"], r["value_codes"]
        fp16 = sum(r[n]["differ"] for n in ("k_norm", "v_scale", "v_zero") if n in r)
        margin = "-" if k["max_margin"] is None else f"{k['max_margin']:.3g}"
        lines.append(f"{k['flips']:>10} {k['ties']:>5} {margin:>10} {v['flips']:>10} {v['ties']:>5} {fp16:>9}  "
                     f"{r['id'].split('/', 2)[2]}")
    return "\n".join(lines)
