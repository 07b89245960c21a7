"""A time budget (`conform --budget`), the progress bar in estimated seconds, and the ETA's range:
the budget's choice on made-up prices, and the CLI in this process on the toy family."""
import io
import json
import math
from pathlib import Path

import pytest

from conformance.cells import make_cell
from conformance.errors import UsageError
from conformance.registry import Backend
from conformance.run import budget, estimate, records, workers
from conformance.run.progress import Progress
from tests.cli_in_process import main, one_error_line
from tests.engine.worker_starts import count_worker_starts
from tests.engine.toy_cli import lab

CI = ["conform", "--family", "toy", "--tier", "ci"]


@pytest.fixture(autouse=True)
def toy_lab(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.engine.toy_backends")
    import tests.engine.toy_backends  # noqa: F401


def toy(name, per_call, per_work=0.0):
    return Backend(name, {"toy": ("scale", "other")}, lambda: (True, ""), lambda c, i: {},
                   seconds_per_cell=per_call, seconds_per_work=per_work)


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("90s", 90), ("1h30m", 5400), ("300", 300), ("2.5m", 150)])
def test_durations_are_read_as_people_write_them(text, seconds):
    assert budget.parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1m", "0", "m", "1e9"])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(UsageError, match="--budget"):
        budget.parse_seconds(text)


def test_the_budget_runs_every_backend_and_op_first_then_covers_new_axis_values_per_second():
    fast, slow = toy("fast", 0.01), toy("slow", 0.0, 1.0)
    cells = ([make_cell("toy", "scale", n=n, factor=f) for n in (8, 9, 10) for f in (1.0, 2.0)]
             + [make_cell("toy", "other", n=40, factor=1.0)])
    pairs = [(c, b) for c in cells for b in (fast, slow)]
    # slow costs n seconds a cell: 8 + 40 for its two ops, then 9 covers (n=9, factor=...) pairs
    stages, left = budget.choose(pairs, capacity_s=70.0, jobs=1)
    # each (backend, op)'s cheapest cell runs first, as a stage of its own
    assert {(c.op, c["n"], c["factor"], b.name) for c, b in stages[0]} == {
        ("scale", 8, 1.0, "fast"), ("other", 40, 1.0, "fast"), ("scale", 8, 1.0, "slow"), ("other", 40, 1.0, "slow")}
    chosen = stages[0] + stages[1]
    got = {(c.id, b.name) for c, b in chosen}
    assert {c.id for c, b in chosen if b is fast} == {c.id for c in cells}   # cheap: all of it
    slow_cells = [c for c, b in chosen if b is slow]
    assert {(c.op, c["n"]) for c in slow_cells} >= {("scale", 8), ("other", 40)}
    assert sum(estimate.first_estimate(c, slow) for c in slow_cells) <= 70.0 - 0.06
    assert len(chosen) + len(left) == len(pairs) and not got & {(c.id, b.name) for c, b in left}
    # each list in the order chosen (the order the pool runs them in): the first stage cheapest first,
    # then the most new axis-value pairs per second, the fast backend's cells before the slow one's
    assert [b.name for c, b in stages[0]] == ["fast", "fast", "slow", "slow"] and stages[0][2][0]["n"] == 8
    assert [b.name for c, b in stages[1]] == ["fast"] * 5 + ["slow"] * 2


def test_the_pool_runs_a_stage_in_its_order_one_environment_at_a_time_a_gpu_backend_without_a_gpu_with_the_cpu_ones(
        monkeypatch):
    """A budgeted stage comes in the order its pairs were chosen: the pool keeps it within each worker
    environment and runs the environments in the order of their first item (a slot starts a worker
    once per environment); a backend that declares ``uses_gpu`` on a pool without a device is in the
    CPU workers' items, not queued after them in workers of its own."""
    import dataclasses

    from conformance import registry

    good, gpu = registry.get("toy-good"), registry.get("toy-gpu")
    other = dataclasses.replace(registry.get("toy-good-marked"), env={"KERNEL_LAB_TOY_GROUP": "b"})
    c = [make_cell("toy", "scale", n=n, factor=1.0) for n in (8, 9, 10, 11)]
    work = [(c[0], [other]), (c[1], [gpu, good]), (c[2], [other]), (c[3], [gpu])]   # the budget's order
    starts = count_worker_starts(monkeypatch)
    got = []
    workers.LocalPool(1).run(work, got.append)
    assert [(r["params"]["n"], r["backend"]) for r in got] == [
        (8, other.name), (10, other.name), (9, "toy-gpu"), (9, "toy-good"), (11, "toy-gpu")]
    assert len(starts) == 2 and {r["device"] for r in got} == {"cpu"}
    assert "TRITON_CACHE_AUTOTUNING" not in starts[1]   # a CPU worker's environment, shared with toy-good
    # with devices, the GPU backend's items are GPU items, an environment of their own, queued after
    # the CPU ones (a GPU machine's long CPU chains start first)
    queued = [(it.cell["n"], [b.name for b in it.backends], it.gpu) for it in workers.items(work, gpus=True)]
    assert queued == [(8, [other.name], False), (10, [other.name], False), (9, ["toy-good"], False),
                      (9, ["toy-gpu"], True), (11, ["toy-gpu"], True)]


def test_pairs_that_do_not_fit_are_left_out_not_dropped():
    slow = toy("slow", 0.0, 1.0)
    pairs = [(make_cell("toy", "scale", n=n, factor=1.0), slow) for n in (8, 9)]
    stages, left = budget.choose(pairs, capacity_s=5.0, jobs=1)
    assert stages == [] and left == pairs


def test_the_bar_counts_estimated_seconds_so_skips_written_first_do_not_move_it():
    stream = io.StringIO()
    bar = Progress(100.0, stream)
    for _ in range(50):
        bar.advance(0.0, "skip")
    assert "  0%" in stream.getvalue().splitlines()[-1]
    bar.advance(60.0, "one long pair")
    assert " 60%" in stream.getvalue().splitlines()[-1]
    bar.advance(60.0, "over the estimate")
    assert " 99%" in stream.getvalue().splitlines()[-1]   # not done before the last record
    bar.advance(0.0, "last", finished=True)
    assert "100%" in stream.getvalue().splitlines()[-1]


def test_the_eta_is_a_range_until_enough_pairs_have_finished():
    b = toy("g", 1.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(40)]
    est = estimate.Estimator([(c, b) for c in cells], jobs=1)
    assert est.eta() == "0m28s-0m56s"   # 40 s at the price, before any pair
    for i, c in enumerate(cells[:12]):
        est.done({"id": c.id, "backend": "g", "status": "pass", "wall_s": 2.0, "first_in_worker": i == 0})
    assert est.eta() == "0m56s"   # 28 pairs at the measured 2 s


@pytest.fixture
def measured(monkeypatch):
    """Backend "m" priced as measured (2 s a pair of op scale, 0.001 s of op other) on a machine where a
    worker had 0.25 of a core."""
    price = estimate.Price(pair_s=1.0, ops={"toy/scale": estimate.Price(pair_s=2.0),
                                           "toy/other": estimate.Price(pair_s=0.001)})
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"m": price})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 0.25)
    return toy("m", 99.0)   # its declared cost model is not used: it has a measured price


def test_a_core_slower_than_the_prices_machines_raises_the_start_rate_by_the_ratio_of_their_python_loops(
        measured, monkeypatch):
    """The prices' machine ran 45,000 loops of ``spin`` a CPU second, this one 30,000: a CPU second of
    work takes 1.5 of its price here before any pair has run, on top of the share of a core; not known
    on either side, 1."""
    monkeypatch.setattr(estimate, "prices_loops_per_cpu_s", lambda: 45000.0)
    assert estimate.core_slowness({"loops_per_cpu_s": 30000}) == pytest.approx(1.5)
    assert estimate.core_slowness({"load_1m": 0.1, "cores": 2}) == 1.0 and estimate.core_slowness(None) == 1.0
    scale = make_cell("toy", "scale", n=1, factor=1.0)
    slow = estimate.Estimator([(scale, measured)] * 10, jobs=1, share=1.0, slowness=1.5)
    assert slow.start_rate == pytest.approx(0.25 * 1.5) and slow.remaining() == pytest.approx(10 * 2.0 * 0.25 * 1.5)
    monkeypatch.setattr(estimate, "prices_loops_per_cpu_s", lambda: None)
    assert estimate.core_slowness({"loops_per_cpu_s": 30000}) == 1.0


def test_a_measured_price_is_per_op_and_scaled_to_this_machines_load_before_any_pair(measured):
    scale, other = make_cell("toy", "scale", n=1, factor=1.0), make_cell("toy", "other", n=1, factor=1.0)
    assert estimate.first_estimate(scale, measured) == 2.0 and estimate.first_estimate(other, measured) == 0.001
    assert estimate.core_share({"load_1m": 0.0, "cores": 2}, jobs=2) == 1.0
    assert estimate.core_share({"load_1m": 6.0, "cores": 2}, jobs=2) == 0.25
    # the spin got a third of a core: 5 busy threads of other work, whatever the (lagging) load average says
    assert estimate.core_share({"load_1m": 0.5, "cores": 2, "one_thread": 1 / 3}, jobs=1) == pytest.approx(2 / 6)
    assert estimate.core_share({"load_1m": 9.0, "cores": 2, "one_thread": 1.0}, jobs=2) == pytest.approx(2 / 3)
    spun = estimate.spin(0.05)
    assert 0 < spun["one_thread"] <= 1 and spun["loops_per_cpu_s"] > 0
    quiet = estimate.Estimator([(scale, measured)] * 10, jobs=1, share=1.0)
    busy = estimate.Estimator([(scale, measured)] * 10, jobs=1, share=0.25)
    assert quiet.remaining() == pytest.approx(5.0) and busy.remaining() == pytest.approx(20.0)
    unmeasured = estimate.Estimator([(scale, toy("g", 2.0))] * 10, jobs=1, share=1.0)
    assert unmeasured.remaining() == pytest.approx(20.0)   # a declared cost model is not rescaled


def test_pairs_of_a_few_milliseconds_teach_no_rate(measured):
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(20)]
    tiny = [make_cell("toy", "other", n=n, factor=1.0) for n in range(5)]
    est = estimate.Estimator([(c, measured) for c in tiny + cells], jobs=1, share=1.0)
    for c in tiny:   # 40x their price: dispatch jitter, not this machine's speed
        est.done({"id": c.id, "backend": "m", "status": "pass", "wall_s": 0.04, "first_in_worker": False})
    assert est.remaining() == pytest.approx(20 * 2.0 * 0.25)
    w = e = 0.0
    for c in cells[:4]:   # at half their price: the rate moves from 0.25 towards 0.5
        est.done({"id": c.id, "backend": "m", "status": "pass", "wall_s": 1.0, "first_in_worker": False})
        keep = math.exp(-2.0 / est.HORIZON_S)
        w, e = keep * w + 1.0, keep * e + 2.0
    rate = (w + est.PRIOR_S * 0.25) / (e + est.PRIOR_S)
    assert 0.4 < rate < 0.5 and est.rate["m"] == pytest.approx(rate)
    assert est.remaining() == pytest.approx(16 * 2.0 * rate)


def test_a_few_long_pairs_on_many_workers_end_when_the_longest_does():
    short, long_ = toy("short", 1.0), toy("long", 100.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(10)]
    est = estimate.Estimator([(c, short) for c in cells] + [(cells[0], long_)], jobs=8)
    assert est.remaining() == pytest.approx(100.0)   # not (10 + 100) / 8


def test_prices_are_fitted_per_op_with_the_core_share_of_the_run():
    from conformance.run import pricing

    scale = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(6)]
    other = [make_cell("toy", "other", n=n, factor=1.0) for n in range(2)]
    cells = {c.id: c for c in scale + other}
    recs = [{"id": c.id, "backend": "m", "status": "pass", "wall_s": 2.0, "cpu_s": 0.5} for c in scale]
    recs += [{"id": c.id, "backend": "m", "status": "pass", "wall_s": 0.002, "cpu_s": 0.004} for c in other]
    price = pricing.fit(recs, cells)["m"]
    assert list(price.ops) == ["toy/scale"]   # "other" has too few pairs for a price of its own
    assert price.ops["toy/scale"].pair_s == pytest.approx(0.5)   # a core's seconds: CPU time, not wall
    assert pricing.core_share(recs) == 0.25   # the median of min(1, cpu / wall)


def test_a_run_without_cpu_times_prices_only_the_backends_its_machine_has_no_cpu_timed_record_of():
    """A shared machine's wall times count the other jobs' time: where a run of the same machine
    measured CPU time, its runs without CPU times price only the backends that run lacks; another
    machine's wall times still count."""
    from conformance.run import pricing

    cells = {c.id: c for c in (make_cell("toy", "scale", n=n, factor=1.0) for n in range(6))}

    def run(machine, recs):
        return {"cpu": {"model": "x", "cores": 2}, "gpus": [{"name": machine}] if machine else []}, recs

    timed = run(None, [{"id": i, "backend": "m", "status": "pass", "wall_s": 3.0, "cpu_s": 1.0} for i in cells])
    loaded = run(None, [{"id": i, "backend": b, "status": "pass", "wall_s": 5.0} for i in cells for b in "mn"])
    gpu = run("G", [{"id": i, "backend": "m", "status": "pass", "wall_s": 2.0} for i in cells])
    kept = pricing.cpu_timed_where_possible([timed, loaded, gpu])
    assert kept == [timed[1], [r for r in loaded[1] if r["backend"] == "n"], gpu[1]]
    price = pricing.fit([r for recs in kept for r in recs], cells)
    assert price["m"].pair_s == pytest.approx(1.5) and price["n"].pair_s == pytest.approx(5.0)


def test_pricing_refits_only_the_named_backends_and_keeps_the_rest(tmp_path, monkeypatch):
    from conformance.run import pricing

    cells = {c.id: c for c in (make_cell("toy", "scale", n=n, factor=1.0) for n in range(6))}
    recs = [{"id": i, "backend": b, "status": "pass", "wall_s": 2.0, "cpu_s": 1.0} for i in cells for b in "mn"]
    info = {"selection": {"tier": "ci"}, "jobs": 2, "cpu": {"model": "x"}, "gpus": [], "git": {"commit": "c"},
            "started": "now"}
    monkeypatch.setattr(pricing, "_run", lambda run_dir: (info, recs, cells, set()))
    monkeypatch.setattr(pricing.registry, "backends", lambda: {"m": None, "n": None, "kept": None})
    prices = tmp_path / "prices.json"
    old = {"measured": {"note": "before", "core_share": 1.0, "runs": [{"backends": ["kept", "m"]}]},
           "backends": {"kept": {"pair_s": 7.0}, "m": {"pair_s": 9.0}}}
    prices.write_text(json.dumps(old))
    monkeypatch.setattr(pricing, "PRICES", prices)
    assert pricing.main([str(tmp_path), "--backend", "m", "--note", "after"]) == 0
    new = json.loads(prices.read_text())
    assert set(new["backends"]) == {"kept", "m"}   # n ran but was not named: not added
    assert new["backends"]["kept"] == {"pair_s": 7.0} and new["backends"]["m"]["pair_s"] == pytest.approx(1.0)
    assert new["measured"]["runs"][0] == {"backends": ["kept", "m"]} and new["measured"]["runs"][1]["backends"] == ["m"]
    assert new["measured"]["note"].startswith("before; refit m: after")
    with pytest.raises(SystemExit):
        pricing.main([str(tmp_path), "--backend", "nope"])


def _conform(*args) -> tuple[int, str, str]:
    """``kernel-lab conform --family toy --tier ci ARGS`` in a child process (``toy_cli.lab``)."""
    res = lab(*CI, *args)
    return res.returncode, res.stdout, res.stderr


def test_conform_within_a_budget_lists_what_it_left_out_and_resume_runs_it(tmp_path):
    # toy-costly prices a cell at a day: none fits 2 minutes, not even chosen late at the rate toy-good ran at
    rc, out, err = _conform("--backend", "toy-good,toy-costly", "--budget", "2m", "--out", tmp_path)
    info = json.loads((tmp_path / "run.json").read_text())
    left = info["left_out"]
    assert rc == 0 and left["budget"] == "2m" and left["per_backend"] == {"toy-costly": 12}, (out, err)
    assert left["pairs"] == 12 and len(left["ids"]) == 12 and left["chosen_late"] == 0
    assert "12 left out by --budget 2m" in err.splitlines()[0]
    assert "left out by --budget 2m: 12 pairs (toy-costly 12)" in out and "--resume" in out
    assert {r["backend"] for r in records.read(Path(tmp_path) / "cells.jsonl")} == {"toy-good"}
    rc, out, err = _conform("--backend", "toy-good,toy-costly", "--no-budget", "--out", tmp_path, "--resume",
                            "--timeout", "30")
    assert rc == 0 and len(records.read(Path(tmp_path) / "cells.jsonl")) == 24, (out, err)
    assert "left_out" not in json.loads((tmp_path / "run.json").read_text())


def test_a_bad_budget_is_one_line_before_anything_runs(tmp_path, capsys):
    rc, _, err = main(capsys, *CI, "--budget", "soon", "--out", tmp_path)
    assert rc == 2 and "--budget 'soon'" in one_error_line(err) and not (tmp_path / "run.json").exists()


def test_the_second_stage_is_chosen_at_the_rate_each_backend_ran_the_first(monkeypatch):
    """Three backends priced at 1 s a pair; in the first stage ``a`` and ``b`` ran at their price and
    ``slow`` at three times it, so the machine-wide rate (the median over the backends) says 1. With
    31 s left, the second stage takes the ``slow`` pairs that fit at 3 s each (10), not the 30 that
    fit at 1 s (a pair the deadline then stops is waste, and listed as left out anyway)."""
    import time

    from conformance.run import runner

    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {
        name: estimate.Price(pair_s=1.0) for name in ("a", "b", "slow")})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a, b, slow = (toy(name, 0.0) for name in ("a", "b", "slow"))
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(40)]
    first = [(c, x) for c in cells[:8] for x in (a, b, slow)]
    rest = [(c, slow) for c in cells[8:]]
    est = estimate.Estimator(first + rest, jobs=1, share=1.0, stages=[first, rest])
    for c, x in first:
        est.done({"id": c.id, "backend": x.name, "status": "pass", "first_in_worker": False,
                  "wall_s": 3.0 if x is slow else 1.0})
    assert est.machine_rate() == pytest.approx(1.0, rel=0.1) and est.backend_rate("slow") > 2.5
    limit = runner.TimeBudget("1m", 60.0, time.monotonic() + 31.0 + runner.FINISH_S)
    left_out: list = []
    stage = runner._choose_again(workers.by_cell(rest), left_out, limit, est, Progress(1.0, io.StringIO()), jobs=1)
    chosen = [(c, x) for c, xs in stage for x in xs]
    assert 9 <= len(chosen) <= 11 and len(chosen) + len(left_out) == len(rest)
    assert sum(sum(est.expected(c, x)) for c, x in chosen) <= 31.0


@pytest.mark.parametrize("walls, fits", [((1.0, 1.0), (29, 31)), ((0.5, 1.5), (18, 26))])
def test_the_second_stage_is_sized_at_an_upper_quantile_of_the_first_stages_spread(monkeypatch, walls, fits):
    """Backend ``a`` priced at 1 s a pair ran its 8 first-stage pairs at 1 s each, or alternately at 0.5
    and 1.5 s (the same mean): with 31 s left, the second stage takes the 31 pairs that fit at its rate
    where its pairs ran alike, and fewer where they spread, as many as fit at the 90th percentile of
    their time (its rate rests on 8 pairs); their time at the mean rate, what the ETA says, is then
    within the time left."""
    import time

    from conformance.run import runner

    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"a": estimate.Price(pair_s=1.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a = toy("a", 0.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(60)]
    first, rest = [(c, a) for c in cells[:8]], [(c, a) for c in cells[8:]]
    now = [0.0]
    est = estimate.Estimator(first + rest, jobs=1, share=1.0, clock=lambda: now[0], stages=[first, rest])
    for i, (c, x) in enumerate(first):
        est.began("slot 0", c.id, [x.name], now[0], False)
        now[0] += walls[i % 2]
        est.done({"id": c.id, "backend": x.name, "status": "pass", "first_in_worker": False, "wall_s": walls[i % 2]})
    limit = runner.TimeBudget("1m", 60.0, time.monotonic() + 31.0 + runner.FINISH_S)
    left_out: list = []
    stage = runner._choose_again(workers.by_cell(rest), left_out, limit, est, Progress(1.0, io.StringIO()), jobs=1)
    chosen = [(c, x) for c, xs in stage for x in xs]
    assert fits[0] <= len(chosen) <= fits[1] and len(chosen) + len(left_out) == len(rest)
    assert sum(sum(est.expected(c, x)) for c, x in chosen) * est.upper_margin(chosen) <= 31.0
    assert est.finished["a"] == 8 and (est.spread() > 0.5) == (walls[0] != walls[1])
