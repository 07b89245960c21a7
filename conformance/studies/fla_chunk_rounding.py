"""`kernel-lab study fla-chunk-rounding`: FLA's chunk form emulated in NumPy with FLA's bf16 roundings.

fla-core 0.6.0's ``chunk_gated_delta_rule`` rounds to bf16 where the gdn ``bf16-operands`` model does
not (``conformance.backends.fla_gdn``): the output o; q and k straight out of the l2 norm, with the
scale and exp(g) applied to fp32 dot products; the state increment's bf16(v_new exp(g_last - g)) from
the unrounded v_new; T merged from 16-row blocks by TF32-truncated products. The emulation is the
``fla-chunk`` model's oracle
(``numpy_ref.chunked(operand_dtype="bfloat16", rounding_points="fla")`` in float64).

For each fla chunked cell a record ran (default: the H200 run, ledger/h200/peers_full_cells.jsonl),
the emulation's outputs go through the gdn check against the ``bf16-operands`` oracle: its verdict and
o / state rel_l2, beside the recorded ones and the cell's o bound under each model.
"""
from __future__ import annotations

import os

NAME = "fla-chunk-rounding"
DESCRIPTION = ("FLA's chunk form emulated with its bf16 roundings (output, q/k after the l2 norm, the state "
               "increment), checked against the bf16-operands oracle beside a record of the real FLA")
RECORD = os.path.join("ledger", "h200", "peers_full_cells.jsonl")


def add_arguments(parser) -> None:
    parser.add_argument("--record", default=RECORD, help=f"a cells.jsonl with fla chunked records (default {RECORD})")
    parser.add_argument("--filter", default="", help="only cells whose id contains this")


def cell_row(cell, recorded: dict) -> dict:
    """The emulation of one fla chunked cell beside its record."""
    from conformance.families.gdn.check import check, real_rows, written_slots
    from conformance.families.gdn.inputs import make_inputs
    from conformance.families.gdn.models import MODELS
    from conformance.families.gdn.oracle import oracle
    from conformance.families.gdn.tolerances import o_and_state
    from conformance.memo import Memo
    from conformance.numerics import rel_l2

    inputs = make_inputs(cell)
    memo = Memo()
    expected = oracle(cell, inputs, "bf16-operands", memo)
    emulated = oracle(cell, inputs, "fla-chunk", memo)
    o_tol, _ = o_and_state(cell, inputs, expected, MODELS["bf16-operands"])
    fla_tol, _ = o_and_state(cell, inputs, emulated, MODELS["fla-chunk"])
    rows, slots = real_rows(cell, inputs), written_slots(cell, inputs)
    return {"id": cell.id, "recorded": recorded["status"], "recorded_reason": recorded["reason"],
            "emulated": check(cell, "bf16-operands", inputs, emulated, memo).status,
            "o_rel_l2": rel_l2(emulated["o"][rows], expected["o"][rows]),
            "state_rel_l2": rel_l2(emulated["state"][slots], expected["state"][slots]),
            "o_bound": o_tol.rel_l2, "fla_chunk_o_bound": fla_tol.rel_l2}


def check(args) -> None:
    """--record must be a readable cells.jsonl (checked against the record schema), before any work."""
    from pathlib import Path

    from conformance.run import records

    if not Path(args.record).is_file():
        raise ValueError(f"--record {args.record}: not a file (a cells.jsonl with fla chunked records)")
    records.read(args.record)


def run(args) -> dict:
    from conformance.cells import make_cell
    from conformance.run import records as run_records

    records = run_records.read(args.record)
    rows = [cell_row(make_cell("gdn", "chunked", seed=r["seed"], **r["params"]), r) for r in records
            if r["backend"] == "fla" and r["op"] == "chunked" and r["status"] in ("pass", "fail")
            and args.filter in r["id"]]
    return {"study": NAME, "record": args.record, "cells": rows,
            "agree": sum(r["emulated"] == r["recorded"] for r in rows)}


def summarize(result: dict) -> str:
    lines = [f"{'cell':90s} recorded emulated  o/bound  state rel_l2  fla-chunk o bound"]
    for r in result["cells"]:
        lines.append(f"{r['id'][12:]:90s} {r['recorded']:8s} {r['emulated']:8s} {r['o_rel_l2'] / r['o_bound']:8.3f} "
                     f"{r['state_rel_l2']:12.4f}  {r['fla_chunk_o_bound']:.4f}")
    lines.append(f"verdicts agree in {result['agree']} of {len(result['cells'])} cells ({result['record']})")
    return "\n".join(lines)
