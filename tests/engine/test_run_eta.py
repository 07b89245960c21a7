"""The ETA of pairs in flight (a pair far past its price moves it while no record comes) and the
progress line redrawn on a timer, naming the longest-running pair."""
import io
import math
import re

import pytest

from conformance.cells import make_cell
from conformance.registry import Backend
from conformance.run import estimate, eta_replay, executors, runner
from conformance.run.progress import Progress
from conformance.run.selection import Selection


@pytest.fixture(autouse=True)
def toy_lab(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.engine.toy_backends")
    import tests.engine.toy_backends  # noqa: F401


def toy(name, per_call):
    return Backend(name, {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, seconds_per_cell=per_call,
                   seconds_per_work=0.0)


def cells(n):
    return [make_cell("toy", "scale", n=i, factor=1.0) for i in range(n)]


def rec(cell, backend, wall, first=False):
    return {"id": cell.id, "backend": backend, "op": "scale", "status": "pass", "wall_s": wall,
            "first_in_worker": first}


def test_a_replayed_run_with_a_pair_stuck_past_its_price_has_an_eta_growing_with_its_time():
    """20 pairs priced and taking 5 s on 2 workers, and the last one stuck for 300 s: once it is the
    only pair in flight, the ETA learning from finished pairs only stays where it was (what the H100
    full tier showed), while the ETA told of pairs in flight counts its elapsed time and grows."""
    b = toy("g", 5.0)
    pairs = [(c, b, rec(c, "g", 300.0 if i == 20 else 5.0, first=i < 2)) for i, c in enumerate(cells(21))]
    told = eta_replay.replay(pairs, jobs=2, every=10.0, starts=True)
    blind = eta_replay.replay(pairs, jobs=2, every=10.0, starts=False)
    alone = [i for i, s in enumerate(told) if s.t >= 60.0 and s.left > 0]   # the others ended by 50 s
    said = [told[i].remaining for i in alone]
    assert all(b > a for a, b in zip(said, said[1:]))   # grows with its time
    stuck_for = [told[i].t - 50.0 for i in alone]         # it started at 50 s
    assert all(s >= estimate.Estimator.PAST_DUE * e > 0 for s, e in zip(said, stuck_for))   # a share of its time again
    assert [blind[i].remaining for i in alone] == pytest.approx([5.0] * len(alone))   # its price, all along
    assert told[alone[-1]].eta == estimate.hms(told[alone[-1]].remaining)   # settled: one figure


def test_a_pair_in_flight_counts_what_is_left_of_its_prediction_then_a_share_of_its_time_so_far():
    """Before any finished pair of the run ran past its prediction."""
    clock = [100.0]
    b = toy("g", 5.0)
    cs = cells(4)
    est = estimate.Estimator([(c, b) for c in cs], jobs=1, clock=lambda: clock[0])
    assert est.remaining() == pytest.approx(20.0)
    est.began("slot 0", cs[0].id, ["g"], since=100.0, first_in_worker=False)
    for elapsed, left in ((0.0, 5.0), (1.0, 4.0), (2.5, 2.5), (4.0, 1.0), (60.0, 60.0 * est.PAST_DUE)):
        clock[0] = 100.0 + elapsed
        r = est.running["slot 0"]
        assert est.running_left(r) == pytest.approx(left) and est.running_left(r) > 0
    # at 60 s of a 5-s price: the pair in flight counts by its own time; its backend's pairs left keep
    # the rate finished pairs taught
    assert est.backend_rate("g") == pytest.approx(1.0)
    assert est.remaining() == pytest.approx(60.0 * est.PAST_DUE + 3 * 5.0)
    # the range before it settles is the same figure scaled: both ends move with the pair's time
    lo, hi = (estimate.hms(f * est.remaining()) for f in est.SPREAD)
    assert est.eta() == f"{lo}-{hi}"
    # its record ends it: the rate is then its finished wall time's, as before
    est.done(rec(cs[0], "g", 60.0))
    assert not est.running and est.remaining() == pytest.approx(3 * 5.0 * 60.0 / 5.0)


def test_a_pair_past_due_runs_on_as_the_runs_finished_pairs_that_ran_as_far_past_theirs_did():
    """Finished pairs that took 1, 1.2, 1.5 and 3 times their predictions: a pair at 1.1 times its
    own is expected to run the median of 0.1, 0.4 and 1.9 predictions more; one past every finished
    pair's overrun takes the share of its time so far again."""
    clock = [0.0]
    b = toy("g", 10.0)
    cs = cells(6)
    est = estimate.Estimator([(c, b) for c in cs], jobs=1, clock=lambda: clock[0])
    for c, ratio in zip(cs, (1.0, 1.2, 1.5, 3.0)):
        est.began("slot 0", c.id, ["g"], since=clock[0], first_in_worker=True)
        wall = ratio * est.running["slot 0"].predicted
        clock[0] += wall
        est.done(rec(c, "g", wall, first=True))
    assert est.overruns == pytest.approx([1.0, 1.2, 1.5, 3.0])
    est.began("slot 0", cs[4].id, ["g"], since=clock[0], first_in_worker=True)   # raises no rate while it runs
    r = est.running["slot 0"]
    p = est.prediction(r)
    clock[0] += 1.1 * p
    assert est.running_left(r) == pytest.approx(0.4 * p)
    clock[0] += 2.0 * p   # at 3.1 predictions
    assert est.running_left(r) == pytest.approx(est.PAST_DUE * 3.1 * p)


def test_pairs_of_one_backend_in_flight_side_by_side_past_their_prediction_do_not_rescale_the_pairs_left():
    """Four pairs priced at 5 s run side by side for 15 s (on one GPU, as the H200 full tier's ``fla``
    pairs did): each counts by its own time, the 16 pairs left of the backend stay at the rate that
    finished pairs taught (their records, when they come, teach it)."""
    clock = [0.0]
    g = toy("g", 5.0)
    cs = cells(24)
    est = estimate.Estimator([(c, g) for c in cs], jobs=4, clock=lambda: clock[0])
    for c in cs[:4]:
        est.done(rec(c, "g", 5.0))
    for i, c in enumerate(cs[4:8]):
        est.began(f"slot {i}", c.id, ["g"], since=0.0, first_in_worker=False)
    clock[0] = 15.0
    assert est.backend_rate("g") == pytest.approx(1.0)
    in_flight = sum(est.running_left(r) for r in est.running.values())
    assert est.remaining() == pytest.approx((in_flight + 16 * 5.0) / 4)


def test_one_steady_pair_of_an_estimated_second_moves_a_measured_prices_rate_less_than_half_way(by_work):
    """A first steady pair pays its op's first call (an interpreter backend's took five times its
    price, its next ones their price): it counts for less than the start rate's prior."""
    cs = sized([20] * 3)   # a second each at the price
    est = estimate.Estimator([(c, by_work) for c in cs], jobs=1)
    assert est.start_rate == 1.0 and est.weight(rec(cs[0], "a", 0.0)) == pytest.approx(1.0)
    est.done(rec(cs[0], "a", 5.0))
    assert 1.0 < est.rate["a"] < (1.0 + 5.0) / 2


def test_first_pairs_and_remote_calls_in_flight_count_by_their_time_but_teach_no_rate():
    clock = [0.0]
    g, h = toy("g", 5.0), toy("h", 1.0)
    cs = cells(4)
    est = estimate.Estimator([(c, g) for c in cs] + [(cs[0], h)], jobs=2, clock=lambda: clock[0])
    est.began("slot 0", cs[0].id, ["g"], since=0.0, first_in_worker=True)   # a worker's compile, once
    est.began("node/cpu", cs[1].id, ["g"], since=0.0)                     # a remote call: not known
    clock[0] = 30.0
    assert est.backend_rate("g") == 1.0
    assert est.remaining() == pytest.approx((2 * 30.0 * est.PAST_DUE + 2 * 5.0 + 1.0) / 2)
    # a remote call of two backends of one cell counts as one: its time against both predictions
    est.began("node/cpu", cs[0].id, ["g", "h"], since=30.0)
    assert est.running_left(est.running["node/cpu"]) == pytest.approx(6.0)
    # a pair retried elsewhere is in flight only where it began again
    est.began("slot 1", cs[0].id, ["g"], since=30.0)
    assert est.running["node/cpu"].backends == ["h"] and "slot 0" not in est.running
    est.done(rec(cs[0], "h", 1.0))
    assert "node/cpu" not in est.running


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def quick_refresh(monkeypatch):
    """The progress line redrawn every 0.2 s, naming a pair in flight after 0.5 s; a file or pipe
    gets a line per 1 s at most; the slow toy backend takes 3 s (a real worker process)."""
    monkeypatch.setattr(runner, "REFRESH_S", 0.2)
    monkeypatch.setattr(runner, "LONG_RUNNING_S", 0.5)
    monkeypatch.setattr(Progress, "EVERY_S", 1.0)
    monkeypatch.setenv("KERNEL_LAB_TOY_SLOW_S", "3")
    monkeypatch.setenv("KERNEL_LAB_FAKE_DEVICES", "")   # no GPU: the slow toy runs on the CPU
    monkeypatch.setenv("COLUMNS", "160")   # the terminal's width, which the line is cut to


def run_slow(tmp_path, stream):
    sel = Selection("smoke", family="toy", backends=("toy-gpu-slow",), filter="n=8/")
    return runner.run(sel, tmp_path, executor=executors.LocalExecutor(jobs=1), stream=stream)


def test_the_progress_line_is_redrawn_while_a_pair_runs_and_names_it(tmp_path, quick_refresh):
    stream = Tty()
    assert run_slow(tmp_path, stream).exit_status == 0
    out = stream.getvalue()
    before_record = out.split("1/1 pairs")[0]   # every redraw before the one record came
    times = re.findall(r"longest running: toy-gpu-slow toy/scale/n=8/factor=1\.0/seed=0 0m0(\d)s", before_record)
    assert len(before_record.split("\r")) > 5 and len(set(times)) >= 2   # redrawn, its time counting
    assert all("\n" not in part for part in before_record.split("\r")[1:])   # in place: one line


def test_a_file_or_a_pipe_gets_a_redrawn_line_at_most_once_per_interval(tmp_path, quick_refresh, capsys):
    stream = io.StringIO()
    result = run_slow(tmp_path, stream)
    assert result.exit_status == 0
    lines = [ln for ln in stream.getvalue().splitlines() if ln.startswith("[")]
    waiting = [ln for ln in lines if "0/1 pairs" in ln]
    assert any("longest running: toy-gpu-slow" in ln for ln in waiting)
    assert 2 <= len(waiting) <= 1 + result.elapsed_s   # a line per second at most, not one per redraw
    assert lines[-1].startswith("[####################] 100% 1/1 pairs")
    # the run replayed: a row a second of what each ETA said against the time left
    assert eta_replay.main([str(tmp_path), "--every", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 pairs on 1 workers, replayed: 0m0") and "within 30% from the first minute on" in out


def test_each_executor_says_when_its_pairs_start_before_their_records_come(monkeypatch):
    """The local pool: each pair as it is sent to its worker, whether it is the worker's first of its
    backend; a remote slot: each call, its backends together, first pair or not unknown."""
    from conformance import registry
    from conformance.run.remote import RemoteExecutor
    from tests.engine.fake_cluster import FakeEngine

    monkeypatch.setenv("KERNEL_LAB_FAKE_DEVICES", "")
    backends = [registry.get("toy-good"), registry.get("toy-wrong")]
    work = [(make_cell("toy", "scale", n=n, factor=1.0), backends) for n in (8, 9)]
    for executor, want in ((executors.LocalExecutor(jobs=1),
                            [("slot 0", 8, ["toy-good"], True), ("slot 0", 8, ["toy-wrong"], True),
                             ("slot 0", 9, ["toy-good"], False), ("slot 0", 9, ["toy-wrong"], False)]),
                           (RemoteExecutor(FakeEngine({"nodes": [{"name": "a"}]})),
                            [("a/cpu", n, ["toy-good", "toy-wrong"], None) for n in (8, 9)])):
        events = []
        executor.start(backends)
        executor.use_class(None)
        executor.run(work, lambda r: events.append(("record", r["id"], r["backend"])),
                     lambda slot, cell, names, since, first: events.append(("began", slot, cell, names, first)))
        executor.close()
        began = [(slot, cell["n"], names, first) for kind, slot, cell, names, first in
                 (e for e in events if e[0] == "began")]
        assert began == want
        for i, e in enumerate(events):   # a pair's record comes after it began
            if e[0] == "record":
                assert any(b[0] == "began" and b[2].id == e[1] and e[2] in b[3] for b in events[:i])


@pytest.fixture
def two_measured(monkeypatch):
    """Backends ``a`` and ``b`` with a measured price of 1 s a pair, measured with a core each."""
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"a": estimate.Price(pair_s=1.0),
                                                                          "b": estimate.Price(pair_s=1.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    return toy("a", 9.0), toy("b", 9.0)


def test_a_backend_not_run_yet_takes_the_machines_whole_time_rate_compile_included(two_measured):
    """``a``'s steady pairs take a fifth of their price and one autotunes for 5 s (set apart as
    compile time): ``a`` took its prices' time in all, so ``b``, not run yet, is expected at its price,
    not at the fifth ``a``'s rate has between its autotunes."""
    a, b = two_measured
    cs = cells(16)
    est = estimate.Estimator([(c, a) for c in cs[:6]] + [(c, b) for c in cs[6:]], jobs=1, share=1.0)
    for i, c in enumerate(cs[:6]):
        est.done({"id": c.id, "backend": "a", "status": "pass", "wall_s": 5.0 if i == 5 else 0.2,
                  "first_in_worker": False})
    assert est.rate["a"] < 0.4 and est.compile_later_s["a"] > 4.0   # the autotune was set apart
    assert est.machine_rate() == pytest.approx(1.0)
    assert est.per_backend()["b"] == pytest.approx(10 * 1.0)


def test_a_backends_first_pair_teaches_its_workers_startup_and_its_pairs_keep_the_machines_rate(two_measured):
    """``a`` ran at its price; ``b``'s one first pair, priced at 1 s, took 20 s (its worker's
    imports): its 19 s beyond its cell are the startup of ``b``'s other worker, once, and ``b``'s 11
    pairs left are expected at the machine's rate, not at a rate raised by the startup (on the H100
    machine ``fla``'s first pair, priced at 0.4 s, took 12 s and its later pairs a fifth to nine
    tenths of their price)."""
    a, b = two_measured
    cs = cells(16)
    clock = [0.0]
    est = estimate.Estimator([(c, a) for c in cs[:4]] + [(c, b) for c in cs[4:]], jobs=2, share=1.0,
                             clock=lambda: clock[0])
    for c in cs[:4]:
        est.done({"id": c.id, "backend": "a", "status": "pass", "wall_s": 1.0, "first_in_worker": False})
    est.done({"id": cs[4].id, "backend": "b", "status": "pass", "wall_s": 20.0, "first_in_worker": True})
    assert est.backend_rate("b") == pytest.approx(1.0)   # a's whole time over whole estimate: 1
    assert est.startup_here("b") == pytest.approx(19.0) and est.startups_left["b"] == 1
    assert est.per_backend()["b"] == pytest.approx(11 * 1.0 + 19.0)
    est.began("slot 1", cs[5].id, ["b"], since=0.0, first_in_worker=True)
    assert est.running["slot 1"].predicted == pytest.approx(1.0 + 19.0)


def test_a_backend_not_run_yet_takes_the_median_of_the_backends_seen_with_the_prior_counted_once(monkeypatch):
    """Five backends each ran one pair of 0.2 estimated seconds at 4 times its price (a busy machine):
    the sixth, not run yet, is expected at their median moved from the start rate by their 1
    estimated second together against ``PRIOR_S``, not at the median of five rates each held near
    the start rate by a prior of its own."""
    names = "abcdef"
    monkeypatch.setattr(estimate, "measured_prices",
                        lambda machine=None: {n: estimate.Price(pair_s=0.2) for n in names})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    backends = [toy(n, 9.0) for n in names]
    cs = cells(12)
    est = estimate.Estimator([(c, b) for b in backends for c in cs[:2]], jobs=1, share=1.0)
    for b in backends[:5]:
        est.done({"id": cs[0].id, "backend": b.name, "status": "pass", "wall_s": 0.8, "first_in_worker": False})
    pooled = (4.0 * 1.0 + est.PRIOR_S * 1.0) / (1.0 + est.PRIOR_S)
    assert est.machine_rate() == pytest.approx(pooled) and pooled > 2.0
    assert est.per_backend()["f"] == pytest.approx(2 * 0.2 * pooled)


def test_a_workers_first_pair_runs_its_cell_at_its_size_classs_rate_and_its_startup_at_the_backends(monkeypatch):
    """Quarter-second pairs ran at 4 times their price (their fixed cost); a 10-s chain that is a
    worker's first pair, with a 2-s startup, is expected at 10 s (its size class, larger than any
    finished, goes by the start rate) plus the startup at the backend's rate: not all 12 s at the
    small pairs' rate (in the H200 chain run a 55-s chain, a worker's first, was predicted at 166 s
    and took 36)."""
    monkeypatch.setattr(estimate, "measured_prices",
                        lambda machine=None: {"a": estimate.Price(startup_s=2.0, work_s=0.05)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a = toy("a", 9.0)
    small, large = sized([5] * 6), sized([200] * 2)
    clock = [0.0]
    est = estimate.Estimator([(c, a) for c in small + large], jobs=2, share=1.0, clock=lambda: clock[0])
    for c in small[:4]:
        est.done(rec(c, "a", 1.0))
    rate = est.backend_rate("a")
    assert rate > 2.0 and est.backend_rate("a", estimate.size_class(10.0)) == pytest.approx(1.0)
    est.began("slot 0", large[0].id, ["a"], since=0.0, first_in_worker=True)
    assert est.running["slot 0"].predicted == pytest.approx(10.0 * 1.0 + 2.0 * rate)


def test_each_stage_of_a_budgeted_run_starts_its_workers_afresh_and_pays_their_startups(monkeypatch):
    """A backend with pairs in both stages of a budgeted run meets its startup price on each of
    the 2 workers of each stage: 4 startups, not 2."""
    monkeypatch.setattr(estimate, "measured_prices",
                        lambda machine=None: {"a": estimate.Price(startup_s=10.0, pair_s=1.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a = toy("a", 9.0)
    cs = cells(8)
    stages = [[(c, a) for c in cs[:2]], [(c, a) for c in cs[2:]]]
    est = estimate.Estimator(stages[0] + stages[1], jobs=2, share=1.0, stages=stages)
    assert est.startups_left["a"] == 4 and est.work_left() == pytest.approx(8 * 1.0 + 4 * 10.0)
    assert estimate.Estimator(stages[0] + stages[1], jobs=2, share=1.0).startups_left["a"] == 2


def test_a_replay_runs_a_cells_pairs_of_one_environment_in_turn_and_a_stage_after_the_one_before():
    """Two backends of one worker environment on one cell are one item, run in turn on one worker
    (the pool's items): 2 + 3 s on one of the 2 workers; a second stage begins once the first has
    ended, so its 1-s pair ends at 6 s, not at 1 s on the idle worker."""
    g, h = toy("g", 1.0), toy("h", 1.0)
    c0, c1 = cells(2)
    pairs = [(c0, g, rec(c0, "g", 2.0, first=True)), (c0, h, rec(c0, "h", 3.0, first=True))]
    assert eta_replay.replay(pairs, jobs=2, every=1.0)[0].left == pytest.approx(5.0)
    staged = pairs + [(c1, g, rec(c1, "g", 1.0, first=True))]
    assert eta_replay.replay(staged, jobs=2, every=1.0)[0].left == pytest.approx(5.0)
    assert eta_replay.replay(staged, jobs=2, every=1.0, stage_sizes=[2, 1])[0].left == pytest.approx(6.0)


@pytest.fixture
def by_work(monkeypatch):
    """Backend ``a`` with a measured price of 0.05 s per unit of work (a toy cell's ``n``), measured
    with a core, as this machine has: its start rate is 1."""
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"a": estimate.Price(work_s=0.05)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    return toy("a", 9.0)


def sized(ns):
    return [make_cell("toy", "scale", n=n, factor=float(i)) for i, n in enumerate(ns)]


def class_rate(walls_and_estimates, prior_s=estimate.Estimator.PRIOR_S, prior_rate=1.0):
    """The rate of one size class's steady pairs, as ``Estimator`` keeps it (forgetting, prior)."""
    w = e = 0.0
    for wall, est in walls_and_estimates:
        keep = math.exp(-est / estimate.Estimator.HORIZON_S)
        w, e = keep * w + wall, keep * e + est
    return (w + prior_s * prior_rate) / (e + prior_s)


def test_pairs_of_different_sizes_of_one_backend_are_rated_apart(by_work):
    """Quarter-second pairs at 4 times their price (their fixed cost) and 10-s pairs at half of it,
    as one backend's small pairs and long chains ran on the GPU machines: the pairs left of each
    size are expected at their own size class's rate, not at one rate of the two."""
    small, large = sized([5] * 8), sized([200] * 4)
    est = estimate.Estimator([(c, by_work) for c in small + large], jobs=1, share=1.0)
    for c in small[:4]:
        est.done(rec(c, "a", 1.0))
    for c in large[:2]:
        est.done(rec(c, "a", 5.0))
    r_small, r_large = class_rate([(1.0, 0.25)] * 4), class_rate([(5.0, 10.0)] * 2)
    assert est.backend_rate("a", estimate.size_class(0.25)) == pytest.approx(r_small) and r_small > 2
    assert est.backend_rate("a", estimate.size_class(10.0)) == pytest.approx(r_large) and r_large < 0.6
    assert est.per_backend()["a"] == pytest.approx(4 * 0.25 * r_small + 2 * 10.0 * r_large)


def test_a_size_class_larger_than_any_finished_goes_by_the_start_rate_where_the_backends_is_higher(by_work):
    """Quarter-second pairs at 4 times their price: a 10-s pair left, of a class none has finished,
    is expected at the start rate (the small pairs' excess is their fixed cost), a 0.05-s one, smaller
    than the finished, at the backend's rate; a backend faster than its price keeps its rate for both."""
    tiny, small, large = sized([1] * 2), sized([5] * 6), sized([200] * 2)
    est = estimate.Estimator([(c, by_work) for c in tiny + small + large], jobs=1, share=1.0)
    for c in small[:4]:
        est.done(rec(c, "a", 1.0))
    rate = est.rate["a"]
    assert rate > 2 and est.backend_rate("a", estimate.size_class(10.0)) == pytest.approx(1.0)
    assert est.backend_rate("a", estimate.size_class(0.05)) == pytest.approx(rate)
    assert est.per_backend()["a"] == pytest.approx(2 * 0.05 * rate + 2 * 0.25 * rate + 2 * 10.0 * 1.0)
    fast = estimate.Estimator([(c, by_work) for c in small + large], jobs=1, share=1.0)
    for c in small[:4]:
        fast.done(rec(c, "a", 0.05))
    assert fast.rate["a"] < 1.0 and fast.backend_rate("a", estimate.size_class(10.0)) == pytest.approx(fast.rate["a"])


@pytest.mark.parametrize("ratio", [0.8, 1.25])
def test_a_size_class_none_has_finished_goes_by_the_size_slope_the_run_has_learned(monkeypatch, ratio):
    """Backend ``b``'s quarter-second pairs ran at twice their price and its 1-s pairs at ``2 * ratio``
    (larger pairs cheaper per unit, as on the Zen 4 EPYC, or dearer, as on the first Zen): ``a``, whose
    quarter-second pairs ran at 3 times theirs, has its 10-s pairs left, two classes up, expected at its
    rate times ``ratio ** 2`` (with 1.25, above the start rate) and its 0.05-s pairs, two down, divided
    by it; a slope past ``SLOPE_CAP`` is held there."""
    monkeypatch.setattr(estimate, "measured_prices",
                        lambda machine=None: {n: estimate.Price(work_s=0.05) for n in ("a", "b")})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a, b = toy("a", 9.0), toy("b", 9.0)
    tiny, small, medium, large = sized([1] * 2), sized([5] * 4), sized([20] * 2), sized([200] * 2)
    pairs = [(c, a) for c in tiny + small + large] + [(c, b) for c in small + medium]
    est = estimate.Estimator(pairs, jobs=1, share=1.0)
    for c in small:
        est.done(rec(c, "a", 0.75))
    assert est.size_slope() is None   # one class of one backend: no slope yet
    for c in small:
        est.done(rec(c, "b", 0.5))
    for c in medium:
        est.done(rec(c, "b", 1.0 * 2 * ratio))
    assert est.size_slope() == pytest.approx(math.log(ratio))
    rate = est.rate["a"]
    assert est.backend_rate("a", estimate.size_class(10.0)) == pytest.approx(rate * ratio ** 2)
    assert est.backend_rate("a", estimate.size_class(0.05)) == pytest.approx(rate / ratio ** 2)
    assert est.per_backend()["a"] == pytest.approx(2 * 0.05 * rate / ratio ** 2 + 2 * 10.0 * rate * ratio ** 2)
    steep = estimate.Estimator(pairs, jobs=1, share=1.0)
    for c in small:
        steep.done(rec(c, "b", 0.5))
    for c in medium:
        steep.done(rec(c, "b", 1.0 * 2 * ratio ** 3))
    assert steep.size_slope() == pytest.approx(math.copysign(estimate.Estimator.SLOPE_CAP, math.log(ratio)))


def test_the_longest_pair_left_is_expected_at_its_own_size_classs_rate(by_work):
    """On 8 workers the run ends when its one 10-s pair left does: at the rate of the 10-s pair
    that finished at half its price, not at the backend's rate, raised by its small pairs at 8 times
    theirs."""
    small, large = sized([5] * 8), sized([200] * 2)
    est = estimate.Estimator([(c, by_work) for c in small + large], jobs=8, share=1.0)
    for c in small:
        est.done(rec(c, "a", 2.0))
    est.done(rec(large[0], "a", 5.0))
    r_large = class_rate([(5.0, 10.0)])
    assert est.rate["a"] > 1.0 > r_large
    assert est.remaining() == pytest.approx(10.0 * r_large)


def test_a_machine_kind_takes_the_prices_fitted_on_its_own_runs_and_sharding_the_prices_of_every_run(
        tmp_path, monkeypatch):
    """``m`` took 1 s a pair on a GPU machine and 0.05 s on a CPU machine: pricing writes each
    kind's fit beside the fit of both, and a run on a CPU machine is estimated at 0.05 s a pair;
    without a kind (``selection.cost_shard``, the same on every machine) and on a kind whose runs
    lack the backend, the fit of both. The GPU machine's run recorded its ``spin`` loops: the file keeps
    them for ``core_slowness``, and a refit from runs without keeps the old file's."""
    import json

    from conformance.run import pricing

    cs = cells(6)
    by_dir = {str(tmp_path / kind): ({"selection": {"tier": "ci"}, "jobs": 1, "cpu": {"model": "x", "cores": 2},
                                      "gpus": [{"name": "G"}] if kind == "gpu" else [], "git": {"commit": "c"},
                                      "started": "now", "load": {"loops_per_cpu_s": 40000} if kind == "gpu" else {}},
                                     [{"id": c.id, "backend": "m", "status": "pass", "wall_s": wall, "cpu_s": wall}
                                      for c in cs], {c.id: c for c in cs}, set())
              for kind, wall in (("gpu", 1.0), ("cpu", 0.05))}
    monkeypatch.setattr(pricing, "_run", lambda run_dir: by_dir[str(run_dir)])
    monkeypatch.setattr(pricing.registry, "backends", lambda: {"m": None})
    prices = tmp_path / "prices.json"
    monkeypatch.setattr(pricing, "PRICES", prices)
    assert pricing.main(list(by_dir)) == 0
    written = json.loads(prices.read_text())
    assert written["backends"]["m"]["pair_s"] == pytest.approx(0.525)
    assert {k: s["m"]["pair_s"] for k, s in written["machines"].items()} == pytest.approx({"gpu": 1.0, "cpu": 0.05})
    assert written["measured"]["loops_per_cpu_s"] == 40000
    measured_by_hand = {**written["measured"], "runs": [{k: v for k, v in r.items() if k != "loops_per_cpu_s"}
                                                        for r in written["measured"]["runs"]]}
    pricing.write_prices(tmp_path / "refit.json", [tmp_path / "cpu"], only={"m"},
                         old={**written, "measured": measured_by_hand})
    assert json.loads((tmp_path / "refit.json").read_text())["measured"]["loops_per_cpu_s"] == 40000
    written["machines"]["gpu"] = {}   # a kind whose runs lack the backend
    prices.write_text(json.dumps(written))
    before = estimate.PRICES
    try:
        estimate.use_prices(prices)
        m = toy("m", 9.0)
        assert estimate.first_estimate(cs[0], m, "cpu") == pytest.approx(0.05)
        assert estimate.first_estimate(cs[0], m) == estimate.first_estimate(cs[0], m, "gpu") == pytest.approx(0.525)
        assert estimate.Estimator([(c, m) for c in cs], jobs=1, machine="cpu").work_left() == pytest.approx(0.3)
        assert estimate.core_slowness({"loops_per_cpu_s": 20000}) == pytest.approx(2.0)
    finally:
        estimate.use_prices(before)


def test_a_leave_one_out_replay_prices_each_run_from_the_other_runs_alone(tmp_path, monkeypatch, capsys):
    """Two runs replayed with ``--leave-one-out``: each one estimated with prices fitted on the other
    run only, and the lab's prices in force again afterwards; a single RUN_DIR is refused."""
    from conformance.run import pricing

    sel = Selection("smoke", family="toy", backends=("toy-good",))
    runs = [tmp_path / "a", tmp_path / "b"]
    for d in runs:
        assert runner.run(sel, d, executor=executors.LocalExecutor(jobs=1), stream=io.StringIO()).exit_status == 0
    fitted_on, write = [], pricing.write_prices
    monkeypatch.setattr(pricing, "write_prices",
                        lambda path, dirs, *a, **kw: fitted_on.append(list(dirs)) or write(path, dirs, *a, **kw))
    lab_prices = estimate.PRICES
    assert eta_replay.main(["--leave-one-out", "--summary", *map(str, runs)]) == 0
    assert fitted_on == [[runs[1]], [runs[0]]] and estimate.PRICES == lab_prices
    assert capsys.readouterr().out.count("within 30% from the first minute on") == 2
    with pytest.raises(SystemExit):
        eta_replay.main(["--leave-one-out", str(runs[0])])
    assert "--leave-one-out: expected two RUN_DIRs or more" in capsys.readouterr().err


def test_a_pairs_record_carries_the_setup_its_worker_computed_for_the_cell_once(monkeypatch):
    """The cell's inputs (drawn in 0.05 s here) and oracles are the first pair's ``setup_s``; the
    cell's next pair in the same worker finds them kept and records none (one of another rounding
    model computes its own oracle); a value computed inside another's computation is counted once."""
    import time

    import tests.engine.toy_family as toy_family
    from conformance.memo import Memo
    from conformance.run.inprocess import run_one

    draw = toy_family.make_inputs
    monkeypatch.setattr(toy_family, "make_inputs", lambda cell: (time.sleep(0.05), draw(cell))[1])
    memo, cell = Memo(), cells(1)[0]
    first, second, other = (run_one(cell, name, memo) for name in ("toy-good", "toy-good", "toy-bf16-x"))
    assert first["status"] == second["status"] == other["status"] == "pass"
    assert 0.05 <= first["setup_s"] <= first["duration_s"] + 1.0 and second["setup_s"] == 0.0
    assert 0.0 < other["setup_s"] < 0.05
    nested = Memo()
    nested.get(cell, {}, "outer", lambda: nested.get(cell, {}, "inner", lambda: time.sleep(0.05)))
    assert 0.05 <= nested.computing_s < 0.1


@pytest.fixture
def with_setup(monkeypatch):
    """Backends ``a`` and ``b`` (one worker environment) priced at 1 s a pair, a cell's setup at 4 s."""
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {
        "a": estimate.Price(pair_s=1.0), "b": estimate.Price(pair_s=1.0), estimate.SETUP: estimate.Price(pair_s=4.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    return toy("a", 9.0), toy("b", 9.0)


def test_an_items_first_pair_pays_the_cells_setup_once_and_its_measured_setup_teaches_the_setups_rate(with_setup):
    """Three cells on ``a`` and ``b``: three setups of 4 s, one per item, each paid by the item's first
    pair to begin; a record's ``setup_s`` teaches the setup's rate and leaves its backend's pair at
    the rest of its time (the first pair of a 16384-step chain spent 124-250 s on the oracle where
    the others took 20-42 s: a backend's rate would otherwise take the oracle for its kernel)."""
    a, b = with_setup
    cs = cells(3)
    clock = [0.0]
    est = estimate.Estimator([(c, x) for c in cs for x in (a, b)], jobs=1, share=1.0, clock=lambda: clock[0])
    assert est.work_left() == pytest.approx(6 * 1.0 + 3 * 4.0)
    est.began("slot 0", cs[0].id, ["a"], since=0.0, first_in_worker=False)
    assert est.running["slot 0"].predicted == pytest.approx(1.0 + 4.0)
    clock[0] = 11.0
    assert est.done({**rec(cs[0], "a", 11.0), "setup_s": 9.0}) == pytest.approx(5.0)
    est.began("slot 0", cs[0].id, ["b"], since=11.0, first_in_worker=False)
    assert est.running["slot 0"].predicted == pytest.approx(1.0 * est.backend_rate("b"))   # the setup is paid
    setup_rate = (9.0 + est.PRIOR_S) / (4.0 + est.PRIOR_S)
    assert est.backend_rate(estimate.SETUP) == pytest.approx(setup_rate) and est.backend_rate("a") == pytest.approx(
        (2.0 + est.PRIOR_S) / (1.0 + est.PRIOR_S))
    assert est.per_backend()[estimate.SETUP] == pytest.approx(2 * 4.0 * setup_rate)


def test_a_record_without_setup_s_pays_its_items_setup_in_its_time(with_setup):
    """An older record (no ``setup_s``), not told when it began: the first of its item to come pays the
    item's setup, counted with its own estimate against its wall time."""
    a, b = with_setup
    cs = cells(2)
    est = estimate.Estimator([(c, x) for c in cs for x in (a, b)], jobs=1, share=1.0)
    assert est.done(rec(cs[0], "b", 10.0)) == pytest.approx(5.0)
    assert est.done(rec(cs[0], "a", 2.0)) == pytest.approx(1.0)
    assert est.rate["b"] == pytest.approx((10.0 + est.PRIOR_S) / (5.0 + est.PRIOR_S))


def test_a_resumed_run_learns_from_the_folders_records_as_from_its_own(with_setup):
    """The records of a run before, read on resume, teach the rates as the same records of a live run
    do: the first record of each item pays its cell's setup, whose measured ``setup_s`` teaches the
    setup's rate and leaves the pair the rest of its time (not its whole 11 s)."""
    a, b = with_setup
    cs = cells(2)
    recs = [{**rec(cs[0], "a", 11.0), "setup_s": 9.0}, {**rec(cs[0], "b", 2.0), "setup_s": 0.0},
            {**rec(cs[1], "a", 7.0), "setup_s": 5.0}]
    live = estimate.Estimator([(c, x) for c in cs for x in (a, b)], jobs=1, share=1.0)
    for r in recs:
        live.done(r)
    resumed = estimate.Estimator([(cs[1], b)], jobs=1, share=1.0)
    resumed.learn({c.id: c for c in cs}, {"a": a, "b": b}, recs)
    assert resumed.backend_rate("a") == pytest.approx(live.backend_rate("a")) and live.backend_rate("a") < 1.6
    assert resumed.backend_rate(estimate.SETUP) == pytest.approx(live.backend_rate(estimate.SETUP))
    assert resumed.backend_rate("b") == pytest.approx(live.backend_rate("b"))


def test_the_longest_pair_left_counts_its_items_setup(with_setup):
    """One cell on ``a`` and ten workers: the run takes at least the setup and the pair (5 s), not the
    pair alone."""
    a, _ = with_setup
    est = estimate.Estimator([(cells(1)[0], a)], jobs=10, share=1.0)
    assert est.remaining() == pytest.approx(5.0)


def test_a_budget_pays_a_cells_setup_once_per_item(with_setup):
    """``a`` and ``b`` on one cell cost 1 + 1 s and the cell's 4-s setup once: 6 s fit, 5.9 do not."""
    from conformance.run import budget

    a, b = with_setup
    c = cells(1)[0]
    assert budget.choose([(c, a), (c, b)], 6.0, 1)[1] == []
    assert len(budget.choose([(c, a), (c, b)], 5.9, 1)[1]) == 1


def test_pricing_leaves_an_items_setup_out_of_its_first_pairs_time_and_prices_it_apart():
    """Each cell's first pair (an item of one backend) took 3 s, 2 of them its measured setup: the
    backend is priced at 1 s a pair and the setup at 2 s a cell; an older record of such a pair,
    without ``setup_s``, has the setup price taken from its time."""
    from conformance.run import pricing

    cs = cells(6)
    new = [{"id": c.id, "backend": "m", "status": "pass", "wall_s": 3.0, "setup_s": 2.0} for c in cs]
    old = [{"id": c.id, "backend": "n", "status": "pass", "wall_s": 3.5} for c in cs]
    prices = pricing.fit(new + old, {c.id: c for c in cs}, firsts={id(r) for r in new + old})
    assert prices[estimate.SETUP].at(cs[0]) == pytest.approx(2.0, rel=1e-3)
    assert prices["m"].at(cs[0]) == pytest.approx(1.0, rel=1e-3)
    assert prices["n"].at(cs[0]) == pytest.approx(1.5, rel=1e-3)
    assert estimate.SETUP not in pricing.fit(new, {c.id: c for c in cs})   # no item firsts told: none priced


def test_the_setup_is_priced_on_the_runs_of_a_machine_kind_that_measured_it_and_not_across_kinds(monkeypatch):
    """A CPU machine's run measured its cells' setup, a GPU machine's older run did not: the setup is
    priced for CPU machines alone (the 2-core machine's setup fit carried to the GPU runs' long
    chains left 409 of 713 replayed rows within 30% against 461, 2026-12-06), and the prices of every run
    together keep it inside the backends' time, as the GPU runs do."""
    from conformance.run import pricing

    cs = cells(6)

    def run(kind, setup):
        info = {"selection": {"tier": "ci"}, "jobs": 1, "cpu": {"model": kind, "cores": 2}, "git": {"commit": "c"},
                "gpus": [{"name": "G"}] if kind == "gpu" else [], "started": "now"}
        recs = [{"id": c.id, "backend": "m", "status": "pass", "wall_s": 3.0, "cpu_s": 3.0,
                 **({"setup_s": 2.0} if setup else {})} for c in cs]
        return info, recs, {c.id: c for c in cs}, set(map(id, recs))

    by_dir = {"gpu": run("gpu", False), "cpu": run("cpu", True)}
    monkeypatch.setattr(pricing, "_run", lambda run_dir: by_dir[str(run_dir)])
    monkeypatch.setattr(pricing.registry, "backends", lambda: {"m": None})
    every, by_kind, _, _ = pricing.fit_runs(list(by_dir))
    assert estimate.SETUP not in every and every["m"].at(cs[0]) == pytest.approx(3.0, rel=1e-3)
    assert estimate.SETUP not in by_kind["gpu"] and by_kind["gpu"]["m"].at(cs[0]) == pytest.approx(3.0, rel=1e-3)
    assert by_kind["cpu"][estimate.SETUP].at(cs[0]) == pytest.approx(2.0, rel=1e-3)
    assert by_kind["cpu"]["m"].at(cs[0]) == pytest.approx(1.0, rel=1e-3)


def test_a_budgeted_runs_eta_ends_by_its_deadline():
    """40 pairs of 5 s on one worker and a deadline 30 s away: 200 s of work, but the budget ends the
    run in 30 s (a 4m30s ``make conform`` said 1m09s left 28 s before its deadline); the range
    before it settles ends there too, and a run without a budget keeps the whole work."""
    clock = [0.0]
    pairs = [(c, toy("g", 5.0)) for c in cells(40)]
    est = estimate.Estimator(pairs, jobs=1, clock=lambda: clock[0], deadline=30.0)
    assert est.remaining() == pytest.approx(30.0) and est.eta() == "0m21s-0m30s"
    clock[0] = 25.0
    assert est.remaining() == pytest.approx(5.0)
    assert estimate.Estimator(pairs, jobs=1, clock=lambda: clock[0]).remaining() == pytest.approx(200.0)


@pytest.mark.parametrize("interpreted", [True, False])
def test_an_interpreted_backends_first_pair_of_an_op_in_a_worker_does_not_raise_its_rate(monkeypatch, interpreted):
    """Triton's interpreter pays a kernel's first call once per worker: in two saved runs of the 2-core
    machine a worker's first pairs of an op ran a median 0.8 to 11 times their price per backend, above
    the op's later pairs (0.4 to 4.1) for 15 of 18 backends and runs. Such a pair that took 4 s of a 1-s price
    teaches its backend's rate by at most its prediction (the pairs left stay at 1 s, not 2.2); its
    whole time counts in the machine's rate. A compiled backend's pair is taken as it ran."""
    from conformance import registry

    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"i": estimate.Price(pair_s=1.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    i = Backend("i", {"toy": ("scale", "shift")}, lambda: (True, ""), lambda c, x: {},
                env=registry.INTERPRET_ENV if interpreted else {})
    scale, shift = make_cell("toy", "scale", n=1, factor=1.0), [make_cell("toy", "shift", n=k) for k in range(5)]
    est = estimate.Estimator([(c, i) for c in [scale, *shift]], jobs=1, share=1.0)
    for cell, wall, first in ((scale, 1.0, True), (shift[0], 4.0, False)):
        est.began("slot 0", cell.id, ["i"], first_in_worker=first)
        est.done({**rec(cell, "i", wall, first), "op": cell.op})
    taught = (4.0 + est.PRIOR_S) / (1.0 + est.PRIOR_S)
    assert est.backend_rate("i") == pytest.approx(1.0 if interpreted else taught)
    assert est.totals["i"] == pytest.approx((5.0, 2.0))


def test_a_budgeted_conform_expects_to_end_by_its_deadline(tmp_path, monkeypatch):
    """toy-good priced at a minute a pair under a 10-minute budget: the pairs chosen fill it, and the
    range said before the run ends at the deadline (not at 1.4 times the chosen pairs' time)."""
    import time

    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"toy-good": estimate.Price(pair_s=60.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    monkeypatch.setattr(runner, "core_share", lambda load, jobs: 1.0)
    stream = io.StringIO()
    limit = runner.TimeBudget("10m", 600.0, time.monotonic() + 600.0)
    runner.run(Selection(tier="ci", family="toy", backends=("toy-good",)), tmp_path / "out", jobs=1,
               time_limit=limit, stream=stream)
    lo, hi = re.search(r"expect (\d+)m(\d+)s-(\d+)m(\d+)s", stream.getvalue()).group(1, 3)
    assert int(lo) >= 5 and int(hi) <= 9, stream.getvalue()   # 8 or 9 pairs chosen; 1.4 times is 11m12s+


def test_a_replayed_run_on_a_machine_that_gets_busy_keeps_its_eta_within_30_percent(monkeypatch):
    """Three backends priced at 0.5 s a pair on 2 workers: ``a`` and ``b`` run their first pairs
    with a core each; ``c``'s first pairs take 10 s (each worker's imports, which its price left
    out, as ``fla``'s did on the H100 machine); then other work takes half of each core and every
    pair takes 1.25 s (on the 2-core machine a run's share of a core went from 0.95 to 0.41), ``b``
    and ``c`` run their pairs left after ``a``'s. Taking ``c``'s imports as its rate put the ETA at up to
    2.8 times the time left; keeping ``b``'s rate of a core each, 40 to 49% under it; from 30 s on the
    ETA is within 30% of the time left."""
    monkeypatch.setattr(estimate, "measured_prices",
                        lambda machine=None: {n: estimate.Price(pair_s=0.5) for n in "abc"})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    a, b, c = (toy(n, 9.0) for n in "abc")
    fresh = iter(cells(220))
    pairs = []
    for backend, n, wall, cpu, first in ((a, 2, 0.5, 0.5, True), (a, 10, 0.5, 0.5, False), (b, 2, 0.5, 0.5, True),
                                         (b, 10, 0.5, 0.5, False), (c, 2, 10.0, 10.0, True), (a, 50, 1.25, 0.5, False),
                                         (b, 50, 1.25, 0.5, False), (c, 30, 1.25, 0.5, False)):
        for _ in range(n):
            cell = next(fresh)
            pairs.append((cell, backend, {**rec(cell, backend.name, wall, first), "cpu_s": cpu}))
    samples = eta_replay.replay(pairs, jobs=2, share=1.0, every=10.0)
    assert samples[0].left == pytest.approx(97.25)
    assert eta_replay.within(samples, after_s=30.0) == "7/7"
