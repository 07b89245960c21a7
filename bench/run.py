"""A perf run: measure the selected benches, judge the gates of ``bench/gates.toml`` and the
regression gates against this machine's saved run, and write the perf JSON: pytest-benchmark's
full schema (``machine_info``, ``commit_info``, ``benchmarks`` with every statistic
pytest-benchmark computes, the samples as ``data``, and kernel-lab's record as ``extra_info``),
so ``pytest-benchmark compare`` and ``--histogram`` read it, plus ``kernel_lab_gates``; the gates
also alone in ``gates.json`` beside it.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from bench import baselines, gates, machine, registry
from bench.measure import Record, SetUp, measure, set_up, time_set_up
from conformance.fingerprint import load_now
from conformance.run.progress import Progress


def ticker(total: int, stream=sys.stderr):
    """``tick(label)`` for the measurements: one call of ``total`` on the progress line on stderr,
    with the call's label."""
    line, done = Progress(total, stream), [0]

    def tick(label: str) -> None:
        done[0] += 1
        line.advance(1, f"{done[0]}/{total} {label[:60]}", finished=done[0] >= total)

    return tick


def gated_rows(gate_list: list[gates.Gate], bench_names: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per bench of ``bench_names``, per shape, the implementations that the gates of ``gate_list``
    read (numerators and denominators of the gates whose benches are all selected): what a run of
    ``kernel-lab bench --gated-only`` times."""
    out: dict[str, dict[str, list[str]]] = {}
    for g in gate_list:
        if not g.benches <= set(bench_names):
            continue
        for ref in (g.numerator, g.denominator):
            bench, shape, impl = ref.rsplit("/", 2)
            impls = out.setdefault(bench, {}).setdefault(shape, [])
            impls += [impl] if impl not in impls else []
    return out


def loaded(load: dict | None) -> bool:
    """Whether other work took at least half the cores while measuring (``LOADED`` of them)."""
    return bool(load) and load["load_1m"] >= LOADED * load["cores"]


LOADED = 0.5


def _rows_of(bench: str, rows: dict | None) -> list[tuple[list[str], list[str]]]:
    """The (shapes, implementations) of the ``measure`` calls of one bench: all of it without
    ``rows``; a CPU bench's rows in one call (one interleaved run, so ratios across its shapes see
    the same load: every implementation named at every shape named), a GPU bench's shape by shape
    (with ``rows``, exactly the implementations named there). Shapes the registry lacks are left out
    (a gate reading one is judged a skip by ``gates.judge``, which says so)."""
    b = registry.benches()[bench]
    if rows is None:
        named = {shape: list(registry.impls(bench)) for shape in b.shapes}
    else:
        named = {shape: impls for shape, impls in rows.get(bench, {}).items() if shape in b.shapes}
    if b.device == "cpu":
        return [(list(named), sorted({i for impls in named.values() for i in impls}))] if named else []
    return [([shape], impls) for shape, impls in named.items()]


def planned_rows(bench_names: list[str], rows: dict | None = None) -> list[tuple[str, int]]:
    """(device, repetitions) of each row the run will time: every enabled implementation at every
    shape of ``_rows_of`` (a peer that raises in its set-up is counted, then skipped)."""
    b = registry.benches()
    out = []
    for n in bench_names:
        known = registry.impls(n)
        out += [(b[n].device, b[n].reps) for shapes, impls in _rows_of(n, rows) for label in shapes for name in impls
                if name in known and registry.capability(known[name], b[n].shapes[label]) is None]
    return out


def planned_calls(bench_names: list[str], rows: dict | None = None) -> int:
    """Progress ticks the run will make: per enabled implementation and shape, each CPU call
    (warm-up included), or one per GPU timing. ``rows`` (``gated_rows``): only those."""
    return sum(reps + 1 if device == "cpu" else 1 for device, reps in planned_rows(bench_names, rows))


def _with_load(recs: list[Record]) -> list[Record]:
    """``recs`` with the load when they finished in ``extra_info["load"]``."""
    load = load_now()
    for r in recs:
        r.extra_info["load"] = load
    return recs


def _measure(bench: str, rows: dict | None, tick=None) -> list[Record]:
    """The records of ``bench`` (with ``rows``: only those), the load when it finished in ``extra_info["load"]``."""
    return _with_load([r for shapes, impls in _rows_of(bench, rows) for r in measure(bench, shapes, impls, tick=tick)])


def measure_all(bench_names: list[str], tick=None, rows: dict | None = None) -> dict[str, Record]:
    """Records of every selected bench; with ``rows`` (``gated_rows``) only those."""
    return {r.rid: r for name in bench_names for r in _measure(name, rows, tick)}


def set_up_all(bench_names: list[str], rows: dict | None = None) -> dict[str, list[SetUp]]:
    """Per selected bench, its rows (``rows``: only those) set up to be timed again and again (``time_all``):
    what ``measure_all`` measures, with every input of every row held at once."""
    return {name: [set_up(name, shapes, impls) for shapes, impls in _rows_of(name, rows)] for name in bench_names}


def _time_bench(set_ups: list[SetUp], tick=None) -> list[Record]:
    return _with_load([r for s in set_ups for r in time_set_up(s, tick=tick)])


def time_all(set_ups: dict[str, list[SetUp]], tick=None) -> dict[str, Record]:
    """One run of ``set_up_all``'s rows: their records, as ``measure_all`` gives them."""
    return {r.rid: r for name, ss in set_ups.items() for r in _time_bench(ss, tick)}


def remeasurer(records: dict[str, Record], rows: dict | None = None, set_ups: dict[str, list[SetUp]] | None = None):
    """``remeasure(gate_or_rid)`` for ``gates.judge`` / ``baselines.regression``: measures the
    benches involved once more, whole (every shape, implementation and ceiling, so that records
    compared across shapes still come from one interleaved run; with ``rows``, every row of it
    that a run of those rows measures; with ``set_ups``, ``set_up_all``'s, timed again); the fresh
    records replace the old ones."""
    def again(refs: list[str]) -> dict[str, Record]:
        fresh = {}
        for bench in sorted({ref.rsplit("/", 2)[0] for ref in refs}):
            recs = _time_bench(set_ups[bench]) if set_ups is not None else _measure(bench, rows)
            fresh.update({r.rid: r for r in recs})
        records.update(fresh)
        return fresh

    def remeasure(what):
        if isinstance(what, gates.Gate):
            return again([what.numerator, what.denominator])
        return again([what])[what]
    return remeasure


def judge_all(records: dict[str, Record], gate_list: list[gates.Gate], remeasure=True,
              rows: dict | None = None) -> list[dict]:
    """Gate results for ``gate_list`` (gates whose benches were not measured are left out) and
    the regression gates of every measured record; ``rows``: what was measured (``gated_rows``),
    what a remeasurement measures again."""
    again = remeasurer(records, rows) if remeasure else None
    measured_benches = {rid.rsplit("/", 2)[0] for rid in records}
    results = [gates.judge(g, records, again) for g in gate_list if g.benches <= measured_benches]
    for rec in list(records.values()):
        r = baselines.regression(rec, again)
        if r is not None:
            results.append(r)
    for r in results:   # the heavier load of the two records the ratio compares
        loads = [records[k].extra_info.get("load") for k in (r["numerator"], r["denominator"]) if k in records]
        loads = [x for x in loads if x]
        r["load"] = max(loads, key=lambda x: x["load_1m"]) if loads else None
        r["loaded"] = loaded(r["load"])
    return results


def stats(samples) -> dict:
    """pytest-benchmark's statistics of ``samples`` (seconds), computed by pytest-benchmark itself
    (``min max mean stddev rounds median iqr q1 q3 iqr_outliers stddev_outliers outliers ld15iqr
    hd15iqr ops total``), with the samples as ``data`` and one iteration per round."""
    from pytest_benchmark.stats import Stats

    st = Stats()
    for t in samples:
        st.update(float(t))
    return {**st.as_dict(), "iterations": 1, "data": list(st.data)}


def perf_json(records: dict[str, Record], results: list[dict]) -> dict:
    from pytest_benchmark import __version__
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info
    from pytest_benchmark.utils import get_commit_info

    benchmarks, skipped = [], []
    for rid, r in records.items():
        if r.skip is not None:
            skipped.append({"name": rid, "reason": r.skip})
            continue
        benchmarks.append({"group": r.extra_info["bench"], "name": rid, "fullname": rid,
                           "params": r.extra_info["shape"], "param": rid.split("/", 2)[-1],
                           "extra_info": r.extra_info,
                           "options": {"disable_gc": False, "timer": r.extra_info.get("timing", "perf_counter"),
                                       "min_rounds": len(r.samples), "max_time": 0, "min_time": 0, "warmup": True},
                           "stats": stats(r.samples)})
    machine_info = {**pytest_benchmark_generate_machine_info(), "kernel_lab": machine.fingerprint("cpu")}
    return {"machine_info": machine_info, "commit_info": get_commit_info(),
            "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": __version__,
            "benchmarks": benchmarks, "skipped": skipped, "kernel_lab_gates": results}


def write(out: Path, data: dict) -> None:
    """``out`` (the perf JSON) and ``gates.json`` beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    (out.parent / "gates.json").write_text(json.dumps(data["kernel_lab_gates"], indent=1) + "\n")
