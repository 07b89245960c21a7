"""A budgeted run's idle time: a worker slot whose queue has run dry takes the pairs the budget left
out, in the order it ranked them, where each one's prediction fits before the deadline (chosen
late), on the worker it has; each pair's record says where it was queued, and the ETA replay
follows that order."""
import json
import math
import statistics
import time
from pathlib import Path

import pytest

from conformance.cells import make_cell
from conformance.registry import Backend
from conformance.run import budget, estimate, eta_replay, records, run_queue, workers
from kernel_lab import cli
from tests.cli_in_process import main
from tests.engine.worker_starts import count_worker_starts

BUDGET_S = 20


@pytest.fixture(autouse=True)
def toy_lab(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.engine.toy_backends")
    import tests.engine.toy_backends  # noqa: F401


@pytest.fixture
def priced(monkeypatch):
    """toy-good priced as measured at a second a pair (its pairs take milliseconds), on a machine as
    fast as the prices' one; the second stage sized at four times its expected time, as a first stage
    whose pairs strayed far from their predictions sizes it (``Estimator.upper_margin``); worker starts
    counted. Returns the list of the started workers' environments."""
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {"toy-good": estimate.Price(pair_s=1.0)})
    monkeypatch.setattr(estimate, "prices_core_share", lambda: 1.0)
    monkeypatch.setattr(estimate.Estimator, "upper_margin", lambda self, pairs: 4.0)
    from conformance.run import runner

    monkeypatch.setattr(runner, "core_share", lambda load, jobs: 1.0)
    return count_worker_starts(monkeypatch)


def _conform(capsys, monkeypatch, out: Path, backends: str) -> tuple[int, str, str, float]:
    monkeypatch.setattr(cli, "STARTED", time.monotonic())
    t0 = time.monotonic()
    rc, stdout, stderr = main(capsys, "conform", "--family", "toy", "--tier", "ci", "--backend", backends,
                              "--budget", f"{BUDGET_S}s", "--jobs", "1", "--out", out)
    return rc, stdout, stderr, time.monotonic() - t0


def test_a_slot_whose_queue_runs_dry_takes_the_left_out_pairs_that_fit_on_the_worker_it_has(
        tmp_path, capsys, monkeypatch, priced):
    """All 12 toy-good pairs fit the budget at their price; the second stage, chosen again at four
    times its expected time, takes a few of its 11, and its queue runs dry long before the deadline:
    the slot takes the rest, chosen late, on the worker it has (one worker a stage, no more), and the
    pairs the budget left out are then only toy-costly's, priced at a day, which never start. What ran
    and what was left out agree in run.json, the console, summary.md, the page and the JUnit file."""
    out = tmp_path / "run"
    rc, stdout, stderr, elapsed = _conform(capsys, monkeypatch, out, "toy-good,toy-costly")
    info = json.loads((out / "run.json").read_text())
    recs = records.read(out / "cells.jsonl")
    left = info["left_out"]
    late = [r for r in recs if r.get("chosen_late")]
    assert rc == 0 and elapsed < BUDGET_S - 5, (stdout, stderr)
    assert {r["backend"] for r in recs} == {"toy-good"} and len(recs) == 12
    assert 1 <= len(late) <= 10 and left["chosen_late"] == len(late)
    assert left["pairs"] == 12 and left["per_backend"] == {"toy-costly": 12}
    assert len(priced) == 2 and len({tuple(sorted(env.items())) for env in priced}) == 1   # one worker a stage
    # each record's place in the run's queue: every pair once, the chosen ones before those chosen late
    positions = sorted(r["queue_position"] for r in recs)
    assert positions == list(range(12)) and info["stage_starts"] == [0, 1]
    assert min(r["queue_position"] for r in late) > max(r["queue_position"] for r in recs if r not in late)
    assert {r["slot"] for r in recs} == {"slot 0"}
    assert f"{len(late)} pairs left out at first ran, chosen late" in stdout
    assert f"left out by --budget {BUDGET_S}s: 12 pairs (toy-costly 12)" in stdout
    # the report's views: the same counts
    assert cli.main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    page = next((tmp_path / "report").glob("*.html")).read_text()
    summary = (tmp_path / "report" / "summary.md").read_text()
    junit = (tmp_path / "report" / "junit.xml").read_text()
    assert "12 pairs ran" in page and "12 pairs left out" in page and f"{len(late)} of them were left out" in page
    assert f"12 pairs left out (toy-costly 12); {len(late)} pairs left out at first ran" in summary
    assert junit.count("<testcase") == 12


def test_the_next_pair_whose_prediction_does_not_fit_is_not_started_nor_any_after_it(
        tmp_path, capsys, monkeypatch, priced):
    """The run's estimator expects the cells n < 14 at a second and the rest at 100 s: after the second
    stage's few pairs the slot takes the left-out pairs of a second that fit, then none of 100 s
    starts, and the run ends long before the deadline; those are what run.json lists as left out."""
    monkeypatch.setattr(estimate.Estimator, "expected", lambda self, c, b: (1.0 if c["n"] < 14 else 100.0, 0.0, 0.0))
    out = tmp_path / "run"
    rc, stdout, stderr, elapsed = _conform(capsys, monkeypatch, out, "toy-good")
    recs = records.read(out / "cells.jsonl")
    left = json.loads((out / "run.json").read_text())["left_out"]
    assert rc == 0 and elapsed < BUDGET_S - 5, (stdout, stderr)
    assert sorted(r["params"]["n"] for r in recs) == list(range(8, 14))
    assert sorted(r["params"]["n"] for r in recs if r.get("chosen_late")) == [12, 13]
    assert left["pairs"] == 6 and sorted(int(i.split("n=")[1].split("/")[0]) for i, _ in left["ids"]) == list(
        range(14, 20))
    assert len(priced) == 2


def test_a_pair_chosen_late_starts_only_where_it_fits_at_the_90th_percentile_of_a_pairs_time(
        tmp_path, capsys, monkeypatch, priced):
    """The same run as the first test's with a pair's 90th percentile a thousand times its expected time
    (``Estimator.pair_upper``, as a run whose pairs strayed that far would have it): no left-out pair of a
    second fits at 1000 s, so none is chosen late and the second stage's pairs are all that ran."""
    monkeypatch.setattr(estimate.Estimator, "pair_upper", lambda self: 1000.0)
    out = tmp_path / "run"
    rc, stdout, stderr, elapsed = _conform(capsys, monkeypatch, out, "toy-good")
    recs = records.read(out / "cells.jsonl")
    left = json.loads((out / "run.json").read_text())["left_out"]
    assert rc == 0 and elapsed < BUDGET_S - 5, (stdout, stderr)
    assert not any(r.get("chosen_late") for r in recs) and left["chosen_late"] == 0
    assert 1 <= len(recs) < 12 and left["pairs"] == 12 - len(recs)


def test_a_pairs_90th_percentile_is_the_runs_spread_above_its_expected_time():
    """``pair_upper``: 1 before ``spread`` has pairs; exp(m + 1.28 s) with overruns of median m and
    spread s, at least 1: pairs that all took a small part of their predictions (two groups far apart,
    as a run's first pairs and those after the rates were learned) leave it at 1."""
    c = make_cell("toy", "scale", n=8, factor=1.0)
    est = estimate.Estimator([(c, toy("toy-good"))], jobs=1)
    assert est.pair_upper() == 1.0
    for overruns, median in (([0.5, 1.0, 1.0, 2.0] * 4, 0.0), ([1.0, 2.0, 2.0, 4.0] * 4, math.log(2.0))):
        est.overruns = overruns
        q1, _, q3 = statistics.quantiles(sorted(math.log(x) for x in est.overruns), n=4)
        assert est.pair_upper() == pytest.approx(math.exp(median + 1.28 * (q3 - q1) / 1.349))
        assert est.pair_upper() > 1.5
    est.overruns = [0.2] * 4 + [0.0012] * 8
    assert est.spread() > 2.0 and est.pair_upper() == 1.0


def test_the_eta_of_a_budgeted_run_counts_the_pairs_left_out_that_fit_before_the_deadline():
    """One chosen pair of a second, and left out one of 10 s and one of 100 s, 30 s before the deadline:
    a slot gone idle takes the 10-s one, not the other, so the ETA is 11 s, not 1 s (the chosen pair
    alone) nor the deadline; taken (``add``), it is a pair left like the chosen one, and the ETA the same."""
    clock = [0.0]
    c1, c10, c100 = (make_cell("toy", "scale", n=n, factor=1.0) for n in (1, 10, 100))
    one, ten, hundred = (Backend(n, {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, seconds_per_cell=s,
                                 seconds_per_work=0.0) for n, s in (("one", 1.0), ("ten", 10.0), ("hundred", 100.0)))
    est = estimate.Estimator([(c1, one)], jobs=1, clock=lambda: clock[0], deadline=30.0)
    est.leave_out([(c10, ten), (c100, hundred)])
    assert est.remaining() == pytest.approx(11.0)
    est.add(c10, ten, first_in_worker=True)
    assert est.remaining() == pytest.approx(11.0) and est.fill_seconds() == 0.0
    clock[0] = 25.0
    assert est.remaining() == pytest.approx(5.0)
    # at a 90th percentile of four times a pair's expected time the 10-s pair fits no more (40 s > 30 s)
    wide = estimate.Estimator([(c1, one)], jobs=1, clock=lambda: 0.0, deadline=30.0)
    wide.leave_out([(c10, ten), (c100, hundred)])
    wide.pair_upper = lambda: 4.0
    assert wide.remaining() == pytest.approx(1.0)


def toy(name, env=None):
    return Backend(name, {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, env=env or {})


def test_a_pair_chosen_late_is_the_first_ranked_that_fits_on_the_slots_worker_before_any_other_environment():
    """Ranked c (another environment), a (5 s), b (1 s) on the slot's worker environment: with 3 s
    left, b (the first that fits there), not c ranked before it, nor a that does not fit; a backend
    the worker has not run pays its startup (2 s); with no pair of the slot's environment fitting,
    the first of another that fits with its worker's startup; none when none fits."""
    a, b, c = toy("a"), toy("b"), toy("c", {"X": "1"})
    cell = make_cell("toy", "scale", n=8, factor=1.0)
    secs = {"a": (5.0, 2.0, 0.0), "b": (1.0, 2.0, 0.0), "c": (0.5, 2.0, 0.0)}
    ranked = [(cell, c), (cell, a), (cell, b)]
    env = ((), False)

    def pick(left, seen):
        return budget.next_late(ranked, env, seen, left, lambda cl, bk: secs[bk.name], gpus=False)

    assert pick(3.0, {"a", "b"}) == 2
    assert pick(2.8, set()) == 0    # b would pay its startup: 3 s; c with its worker's, 2.5 s
    assert pick(2.4, set()) is None
    assert pick(0.9, {"a", "b"}) is None
    assert budget.next_late(ranked, None, set(), 3.0, lambda cl, bk: secs[bk.name], False,
                            can_run=lambda bk: bk.name != "c") == 2


def test_the_budget_ranks_the_pairs_it_leaves_out_in_the_order_it_refused_them(monkeypatch):
    """Cells priced at n seconds, 20 s for one worker: the first stage takes n=8 (the cheapest), the
    covering step then n=9 (20 - 8 - 9 = 3 s left) and refuses the others in the order it scores them
    (most new axis-value pairs per second: the cheap ones first), not in the order of the tier."""
    monkeypatch.setattr(estimate, "measured_prices", lambda machine=None: {})   # no cell setup price either
    slow = Backend("slow", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, seconds_per_cell=0.0,
                   seconds_per_work=1.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in (30, 8, 12, 9, 20)]
    stages, left = budget.choose([(c, slow) for c in cells], capacity_s=20.0, jobs=1)
    assert [c["n"] for st in stages for c, _ in st] == [8, 9]
    assert [c["n"] for c, _ in left] == [12, 20, 30]


def _rec(cell, backend, wall, position=None, slot=None, **more):
    r = {"id": cell.id, "backend": backend, "family": "toy", "op": "scale", "params": cell.as_dict(),
         "status": "pass", "wall_s": wall, "first_in_worker": False, **more}
    if position is not None:
        r.update(queue_position=position, slot=slot)
    return r


def test_the_replay_follows_the_queue_positions_of_the_records_and_an_older_folder_the_pools_order(tmp_path):
    """A budgeted run of two backends of one worker environment on 2 slots whose records say where
    they were queued: the replay runs them in that order, a slot's pairs of one cell one item (both
    slots ran n=8, each its own item), the stages split where run.json says the second began, and a
    pair chosen late given to the estimator as it starts (the ETA at the start does not count it).
    The same records without their positions replay in the order the pool would have queued them."""
    from conformance.run.selection import select_cells

    cells = {c["n"]: c for c in select_cells("ci") if c.family == "toy"}
    order = [(8, "toy-good", "slot 0", 2.0), (8, "toy-bf16-x", "slot 1", 1.0), (12, "toy-good", "slot 1", 1.0),
             (9, "toy-good", "slot 0", 1.0), (9, "toy-bf16-x", "slot 0", 1.0), (10, "toy-good", "slot 1", 30.0)]
    recs = [_rec(cells[n], b, wall, i, slot, **({"chosen_late": True} if n == 10 else {}))
            for i, (n, b, slot, wall) in enumerate(order)]
    info = {"selection": {"tier": "ci"}, "jobs": 2, "gpus": [], "backends": {}, "stage_starts": [0, 2],
            "left_out": {"budget": "1m", "pairs": 0, "per_backend": {}, "ids": []}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(info))
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    pairs, _, sizes = run_queue.folder_pairs(run)
    assert [(c["n"], b.name) for c, b, _ in pairs] == [(n, b) for n, b, _, _ in order] and sizes == [2, 4]
    assert [len(it) for it in run_queue.items(pairs, False)] == [1, 1, 1, 2, 1]
    samples = eta_replay.replay(pairs, 2, every=1.0, stage_sizes=sizes, machine="cpu")
    assert samples[0].left == pytest.approx(2.0 + 31.0)   # stage one 2 s, then n=10 on slot 1 after n=12
    planned = [(c, b, {k: v for k, v in r.items() if k != "chosen_late"}) for c, b, r in pairs]
    known = eta_replay.replay(planned, 2, every=1.0, stage_sizes=sizes, machine="cpu")
    # the pair chosen late counts as a pair left out that fits (as the runner counts those) until it starts
    assert [s.remaining for s in samples[:4]] == pytest.approx([k.remaining for k in known[:4]])
    assert samples[0].remaining > eta_replay.replay([p for p in pairs if p[0]["n"] != 10], 2, every=1.0,
                                                    stage_sizes=[2, 3], machine="cpu")[0].remaining

    (run / "cells.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in (
        "queue_position", "slot")}) + "\n" for r in recs))
    pairs, _, sizes = run_queue.folder_pairs(run)
    assert [c["n"] for c, _, _ in pairs] != [n for n, *_ in order] and len(pairs) == 6


def test_a_cluster_slot_whose_queue_runs_dry_asks_for_a_pair_chosen_late_with_its_last_calls_environment():
    """The remote executor asks as the local pool does, once its queue holds nothing a slot can take:
    with the worker environment of the slot's last call and no backend counted as run (its worker is
    out of view); a pair the slot's node cannot run is not offered to it."""
    from conformance.run import remote

    good, absent = toy("toy-good"), toy("toy-absent")
    probes = {"toy-good": (True, "yes"), "toy-absent": (False, "no")}

    class Engine:
        name = "fake"

        def submit(self, slot, cell, names):
            return cell, tuple(names)

        def wait(self, calls):
            return calls

        def result(self, call):
            return [{"id": call[0].id, "backend": n, "status": "pass"} for n in call[1]]

    ex = remote.RemoteExecutor(Engine())
    ex.slots = [remote.RemoteSlot("a", None, {"probes": probes}, None)]
    ex.nodes, ex.device_class = {"a": {"device_class": "lab"}}, "lab"
    c8, c9 = (make_cell("toy", "scale", n=n, factor=1.0) for n in (8, 9))
    asked, late = [], [(c9, good)]

    def more(env, seen, can_run):
        asked.append((env, seen, can_run(good), can_run(absent)))
        return late.pop() if late else None

    got = []
    ex.run([(c8, [good])], got.append, None, more)
    assert [(r["id"], r["backend"]) for r in got] == [(c8.id, "toy-good"), (c9.id, "toy-good")]
    assert asked == [(((), False), set(), True, False)] * 2


def test_a_run_stopped_with_a_pair_in_flight_kills_its_worker_at_once():
    """The deadline stops the run from ``emit`` (as ``runner.BudgetSpent`` does) while toy-hang's pair
    sleeps a minute on the other slot: its worker is killed, not waited for 5 s, so the command ends
    by its budget."""
    from conformance import registry

    good, hang = registry.get("toy-good"), registry.get("toy-hang")
    c8, c9 = (make_cell("toy", "scale", n=n, factor=1.0) for n in (8, 9))

    class Spent(Exception):
        pass

    stopped = []

    def emit(record):
        stopped.append(time.monotonic())
        raise Spent

    pool = workers.LocalPool(2)
    with pytest.raises(Spent):
        pool.run([(c9, [hang]), (c8, [good])], emit)
    assert time.monotonic() - stopped[0] < 2.5 and all(s.worker is None for s in pool.slots)
