"""The measured prices of ``conformance/run/prices.json`` (``estimate.Price``), fitted from the
records of a run folder: per backend, a non-negative least-squares fit of each steady pair's wall
time to ``pair_s + call_s * calls + work_s * work``, and ``startup_s`` the median excess of a
worker's first pair over that fit. The setup an item's first pair paid for the cell (``setup_s``:
its inputs and oracles, ``run_queue``) is left out of the backend's time and priced apart, whatever
the backend, under ``estimate.SETUP`` by the same fit; an item's first pair of a record older than
``setup_s`` has its cell's setup price taken from its time (none where no record measured one: the
setup then stays in the backends' prices, as it was before records measured it). A pair's time is its CPU time where the record has it (at most its
wall time: the seconds it would take with a core of its own, whatever else shared the machine), and
``core_share`` is then 1; records without CPU times give wall times, and ``core_share`` is left to
the note. A run without CPU times is left out for the backends that a run of the same machine (CPU
model, cores and GPUs) with CPU times measured (``cpu_timed_where_possible``): on a shared machine its
wall times count the other jobs' time too (a 2-core ci run beside other jobs took a median 6 times
the CPU time of its pairs in the machine's other runs). ``run_core_share``: the median over pairs of
CPU over wall time, how busy the machine was. The prices are fitted on every run together
(``backends``, the same on every machine) and apart on the runs of each kind of machine
(``machines``: ``gpu`` or ``cpu``, ``estimate.machine_kind``), which a run on such a machine uses;
the setup is split out on the runs of each kind alone (a machine's cells and oracles are its own:
the 2-core machine's ci cells say little of a GPU machine's long chains).

    python -m conformance.run.pricing RUN_DIR [RUN_DIR...] [--note TEXT]

writes prices.json from the records of the RUN_DIRs together (a ``make conform`` run of the machine the
lab's prices describe and, for the backends it cannot run, a GPU machine's runs); backends without a
record that ran keep their declared cost model. ``--backend NAMES`` refits only those backends and keeps
every other price of prices.json and the runs it came from (new GPU runs without a new run of the CPU machine).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from conformance import registry
from conformance.run import records, run_queue
from conformance.run.estimate import PRICES, SETUP, Price, cell_calls, cell_work, machine_kind


MIN_OP_PAIRS = 5   # an op gets a price of its own from at least this many steady pairs


def pair_seconds(record: dict) -> float:
    """The pair's time on a core of its own: CPU time where recorded (at most the wall time), else wall."""
    wall = float(record["wall_s"])
    return min(wall, float(record["cpu_s"])) if record.get("cpu_s") is not None else wall


def _setup_seconds(record: dict) -> float:
    """The record's ``setup_s`` (0 without) as ``pair_seconds`` counts it: its share of the pair's time."""
    setup = float(record.get("setup_s") or 0.0)
    return setup * pair_seconds(record) / float(record["wall_s"]) if setup and record["wall_s"] else 0.0


def _fit_line(rs: list[dict], cells: dict, seconds=pair_seconds) -> tuple[np.ndarray, callable]:
    """Non-negative least squares of ``seconds(r)`` (default ``pair_seconds``) on (1, calls, work) over
    ``rs``: (coefficients, fitted)."""
    features = lambda r: [1.0, cell_calls(cells[r["id"]]), cell_work(cells[r["id"]])]  # noqa: E731
    x = np.array([features(r) for r in rs])
    y = np.array([seconds(r) for r in rs])
    scale = np.maximum(x.max(axis=0), 1e-12)   # columns of like size for the solver
    coef = nnls(x / scale, y)[0] / scale
    return coef, lambda r: float(coef @ features(r))


def _price(coef: np.ndarray, startup_s: float = 0.0, ops: dict | None = None) -> Price:
    return Price(startup_s=round(startup_s, 3), pair_s=float(f"{coef[0]:.4g}"), call_s=float(f"{coef[1]:.4g}"),
                 work_s=float(f"{coef[2]:.4g}"), ops=ops or {})


def _fit_ops(rs: list[dict], cells: dict, seconds) -> tuple[np.ndarray, callable, dict[str, Price]]:
    """``_fit_line`` over ``rs``, and a Price per op that has ``MIN_OP_PAIRS`` of them."""
    coef, fitted = _fit_line(rs, cells, seconds)
    by_op: dict[str, list[dict]] = {}
    for r in rs:
        by_op.setdefault(f"{cells[r['id']].family}/{cells[r['id']].op}", []).append(r)
    ops = {op: _price(_fit_line(group, cells, seconds)[0]) for op, group in sorted(by_op.items())
           if len(group) >= MIN_OP_PAIRS}
    return coef, fitted, ops


def fit(recs: list[dict], cells: dict, firsts: set = frozenset()) -> dict[str, Price]:
    """Backend -> its Price from the records (those that ran, of cells in ``cells``: id -> Cell), with
    a price per op that has ``MIN_OP_PAIRS`` steady pairs; ``firsts``: the ``id()`` of the records of
    pairs first of their item (``run_queue.item_firsts``), whose ``setup_s`` is priced as ``SETUP``."""
    by_backend: dict[str, list[dict]] = {}
    for r in recs:
        if r["status"] != "skip" and r["id"] in cells and r.get("wall_s") is not None:
            by_backend.setdefault(r["backend"], []).append(r)
    paid = [r for rs in by_backend.values() for r in rs if id(r) in firsts]
    setups = [r for r in paid if r.get("setup_s") is not None]
    out, setup_fit = {}, (lambda r: 0.0)
    if setups:
        coef, setup_fit, ops = _fit_ops(setups, cells, _setup_seconds)
        out[SETUP] = _price(coef, ops=ops)

    def own(r: dict) -> float:   # the pair's time without the setup it paid for its item
        if id(r) not in firsts:
            return pair_seconds(r)
        return pair_seconds(r) - (_setup_seconds(r) if r.get("setup_s") is not None else setup_fit(r))

    for name, rs in sorted(by_backend.items()):
        steady = [r for r in rs if not r.get("first_in_worker")] or rs
        coef, fitted, ops = _fit_ops(steady, cells, own)
        excess = [own(r) - fitted(r) for r in rs if r.get("first_in_worker")]
        out[name] = _price(coef, max(0.0, statistics.median(excess)) if excess else 0.0, ops)
    return out


def _as_json(price: Price) -> dict:
    return {k: v for k, v in vars(price).items() if k != "ops"} | (
        {"ops": {op: {k: v for k, v in vars(p).items() if k not in ("ops", "startup_s")}
                 for op, p in price.ops.items()}} if price.ops else {})


def core_share(recs: list[dict]) -> float | None:
    """The median over the records that ran of ``min(1, cpu_s / wall_s)`` (None without ``cpu_s``)."""
    shares = [min(1.0, r["cpu_s"] / r["wall_s"]) for r in recs
              if r["status"] != "skip" and r.get("cpu_s") is not None and r.get("wall_s")]
    return round(statistics.median(shares), 3) if shares else None


def _run(run_dir: Path) -> tuple[dict, list[dict], dict, set]:
    """(run.json, the records of its pairs that ran, id -> Cell of them, the pairs first of their
    item: ``run_queue.item_firsts``) of one run folder (``run_queue.folder_pairs``)."""
    pairs, info, _ = run_queue.folder_pairs(run_dir)
    firsts = run_queue.item_firsts(pairs, machine_kind(info.get("gpus")) == "gpu")
    return info, [r for _, _, r in pairs], {c.id: c for c, _, _ in pairs}, set(map(id, firsts))


def _machine(info: dict) -> tuple:
    """The machine a run.json names: CPU model, cores and GPUs."""
    return info["cpu"]["model"], info["cpu"].get("cores"), tuple(g.get("name") for g in info.get("gpus") or [])


def cpu_timed_where_possible(runs: list[tuple[dict, list[dict]]]) -> list[list[dict]]:
    """Per run of ``runs`` ((run.json, records) each), its records to price from: all of a run with
    CPU times; of a run without, those of the backends that no run of the same machine with CPU
    times has a record of."""
    timed: dict[tuple, set] = {}
    for info, recs in runs:
        timed.setdefault(_machine(info), set()).update(r["backend"] for r in recs if r.get("cpu_s") is not None)
    return [recs if any(r.get("cpu_s") is not None for r in recs)
            else [r for r in recs if r["backend"] not in timed[_machine(info)]] for info, recs in runs]


def fit_runs(run_dirs: list[Path], only: set | None = None, cache: dict | None = None
             ) -> tuple[dict[str, Price], dict[str, dict[str, Price]], list[dict], int]:
    """(backend -> Price from every run, machine kind -> backend -> Price from the runs of machines
    of that kind (``estimate.machine_kind``), one description per run, the number of records priced
    from) of the run folders together (``cpu_timed_where_possible``); ``only``: these backends alone;
    ``cache``: run folder -> what ``_run`` read of it, filled as folders are read (several fits of
    overlapping folders read each once)."""
    cache = {} if cache is None else cache
    for d in map(Path, run_dirs):
        if d not in cache:
            cache[d] = _run(d)
    read = [cache[Path(d)] for d in run_dirs]
    kept = cpu_timed_where_possible([(info, recs) for info, recs, _, _ in read])
    cells = {i: c for _, _, cs, _ in read for i, c in cs.items()}
    firsts = {k for *_, fs in read for k in fs}
    wanted = set(registry.backends()) & (only or set(registry.backends())) | (set() if only else {SETUP})
    runs, by_kind = [], {}
    for (info, *_), recs in zip(read, kept):
        share = core_share(recs)
        ran = sorted({r["backend"] for r in recs if r["status"] != "skip"} & wanted - {SETUP})
        runs.append({**_where(info), "backends": ran, **({"run_core_share": share} if share is not None else {})})
        by_kind.setdefault(machine_kind(info.get("gpus")), []).extend(recs)

    def priced(recs: list[dict], split: set) -> dict[str, Price]:
        return {n: price for n, price in fit(recs, cells, split).items() if n in wanted}

    every_rec = [r for recs in kept for r in recs]
    return (priced(every_rec, set()), {kind: priced(recs, firsts) for kind, recs in sorted(by_kind.items())}, runs,
            len(every_rec))


def _where(info: dict) -> dict:
    loops = (info.get("load") or {}).get("loops_per_cpu_s")
    return {"tier": info["selection"]["tier"], "jobs": info.get("jobs"), "cpu": info["cpu"]["model"],
            "gpus": [g.get("name") for g in info.get("gpus") or []], "commit": info["git"]["commit"],
            "started": info.get("started"), **({"loops_per_cpu_s": loops} if loops else {})}


def loops_per_cpu_s(runs: list[dict], old: dict | None) -> dict:
    """``measured``'s ``loops_per_cpu_s`` (``estimate.spin``, ``estimate.core_slowness``): the median over
    ``runs`` (``_where``) that recorded one, else the ``old`` file's, with its ``loops_note``; none where
    neither has one."""
    seen = sorted(r["loops_per_cpu_s"] for r in runs if r.get("loops_per_cpu_s"))
    if seen:
        return {"loops_per_cpu_s": seen[len(seen) // 2], "loops_note": f"the median of {len(seen)} of the runs"}
    kept = (old or {}).get("measured", {})
    return {k: kept[k] for k in ("loops_per_cpu_s", "loops_note") if k in kept}


def write_prices(path: Path, run_dirs: list[Path], note: str = "", only: set | None = None,
                 old: dict | None = None, cache: dict | None = None) -> tuple[int, int]:
    """Write a prices.json at ``path`` fitted from the run folders (``fit_runs``); with ``only``, those
    backends refit and every other price of ``old`` (a prices.json's content) kept; ``cache`` as ``fit_runs``.
    Returns (backends refit, records priced from)."""
    fitted, by_kind, runs, n_records = fit_runs(run_dirs, only, cache)
    prices = {n: _as_json(price) for n, price in fitted.items()}
    machines = {kind: {n: _as_json(price) for n, price in section.items()} for kind, section in by_kind.items()}
    n_refit = len(prices)
    if old is not None:        # keep the rest of the file
        prices = {**old["backends"], **prices}
        machines = {kind: {**old.get("machines", {}).get(kind, {}), **machines.get(kind, {})}
                    for kind in sorted({*old.get("machines", {}), *machines})}
        runs = old["measured"]["runs"] + runs
        note = f"{old['measured']['note']}; refit {', '.join(sorted(fitted))}: {note}"
    timed_by_cpu = all("run_core_share" in r for r in runs)
    records.dump_json(path, {
        "measured": {"note": note, **({"core_share": 1.0} if timed_by_cpu else {}), **loops_per_cpu_s(runs, old),
                     "runs": runs},
        "backends": {n: prices[n] for n in sorted(prices)},
        "machines": {kind: {n: section[n] for n in sorted(section)} for kind, section in machines.items()}})
    return n_refit, n_records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.run.pricing", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                   help="runs whose records together price each backend (e.g. the 2-core machine's run and a "
                        "GPU machine's runs for the GPU backends)")
    p.add_argument("--note", default="", help="where and when the runs were measured (kept in the file)")
    p.add_argument("--backend", help="comma-separated backends to refit; every other price is kept as it is")
    args = p.parse_args(argv)
    known = registry.backends()
    only = set(args.backend.split(",")) if args.backend else None
    if only and only - set(known):
        p.error(f"--backend: unknown {', '.join(sorted(only - set(known)))} (known: {', '.join(sorted(known))})")
    old = json.loads(PRICES.read_text()) if only is not None else None
    n_refit, n_records = write_prices(PRICES, args.run_dirs, args.note, only, old)
    print(f"{n_refit} backends priced from {n_records} records -> {PRICES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
