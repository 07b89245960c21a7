"""The measured prices of ``conformance/run/prices.json`` (``estimate.Price``), fitted from the
records of a run folder: per backend, a non-negative least-squares fit of each steady pair's wall
time to ``pair_s + call_s * calls + work_s * work``, and ``startup_s`` the median excess of a
worker's first pair over that fit.

    python -m conformance.run.pricing RUN_DIR [--note TEXT]

writes prices.json from RUN_DIR (a complete ``make conform`` run of the machine the lab's prices
describe); backends without a record that ran keep their declared cost model.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from conformance import registry
from conformance.run import records
from conformance.run.estimate import PRICES, Price, cell_calls, cell_work
from conformance.run.selection import select_cells


def fit(recs: list[dict], cells: dict) -> dict[str, Price]:
    """Backend -> its Price from the records (those that ran, of cells in ``cells``: id -> Cell)."""
    by_backend: dict[str, list[dict]] = {}
    for r in recs:
        if r["status"] != "skip" and r["id"] in cells and r.get("wall_s") is not None:
            by_backend.setdefault(r["backend"], []).append(r)
    out = {}
    for name, rs in sorted(by_backend.items()):
        steady = [r for r in rs if not r.get("first_in_worker")] or rs
        x = np.array([[1.0, cell_calls(cells[r["id"]]), cell_work(cells[r["id"]])] for r in steady])
        y = np.array([float(r["wall_s"]) for r in steady])
        scale = np.maximum(x.max(axis=0), 1e-12)   # columns of like size for the solver
        coef = nnls(x / scale, y)[0] / scale
        fitted = lambda r: float(coef @ [1.0, cell_calls(cells[r["id"]]), cell_work(cells[r["id"]])])  # noqa: E731
        firsts = [float(r["wall_s"]) - fitted(r) for r in rs if r.get("first_in_worker")]
        out[name] = Price(startup_s=round(max(0.0, statistics.median(firsts)) if firsts else 0.0, 3),
                          pair_s=float(f"{coef[0]:.4g}"), call_s=float(f"{coef[1]:.4g}"),
                          work_s=float(f"{coef[2]:.4g}"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.run.pricing", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--note", default="", help="where and when the run was measured (kept in the file)")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    info = records.read_json(run_dir / "run.json")
    tier = info["selection"]["tier"]
    cells = {c.id: c for c in select_cells(tier)}
    prices = fit(records.read_partial(run_dir / "cells.jsonl")[0], cells)
    known = registry.backends()
    records.dump_json(PRICES, {
        "measured": {"note": args.note, "tier": tier, "jobs": info.get("jobs"), "cpu": info["cpu"]["model"],
                     "commit": info["git"]["commit"], "started": info.get("started")},
        "backends": {n: vars(p) for n, p in prices.items() if n in known}})
    print(f"{len(prices)} backends priced -> {PRICES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
