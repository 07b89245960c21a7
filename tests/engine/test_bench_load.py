"""`bench` records the machine's load beside each ratio and says so when gates fail under load."""
import numpy as np

from bench import gates, run
from bench.measure import Record


def _records(load_1m: float) -> dict:
    load = {"load_1m": load_1m, "cores": 2}
    return {"b/s/fast": Record("b/s/fast", {"load": load}, np.full(8, 1.0)),
            "b/s/slow": Record("b/s/slow", {"load": load}, np.full(8, 2.0))}


GATE = gates.Gate("fast-vs-slow", "b/s/fast", "b/s/slow", "time", "<=", 0.4)


def test_each_ratio_carries_the_load_it_was_measured_under(monkeypatch):
    monkeypatch.setattr(run.baselines, "regression", lambda rec, again: None)
    (quiet,) = run.judge_all(_records(0.3), [GATE], remeasure=False)
    (busy,) = run.judge_all(_records(2.7), [GATE], remeasure=False)
    assert quiet["verdict"] == busy["verdict"] == "fail" and quiet["ratio"] == 0.5
    assert quiet["load"] == {"load_1m": 0.3, "cores": 2} and not quiet["loaded"]
    assert busy["loaded"] and "2.7/2" in gates.table([busy])


def test_the_load_is_the_machines_own(monkeypatch):
    from conformance import fingerprint

    monkeypatch.setattr(fingerprint.os, "getloadavg", lambda: (1.5, 1.0, 0.5))
    assert run.load_now()["load_1m"] == 1.5 and run.load_now()["cores"] >= 1
