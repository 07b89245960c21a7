"""The gates of bench/gates.toml, each judged on the session's measurement (bench.gates):
a ``fail`` verdict fails the test; ``skip`` skips it with the reason, and so does ``ambiguous``
(the spread straddled the threshold in the measurement and in the one repeat: the machine was too
noisy to decide either way, which a shared CI machine can be). Only CPU gates whose measured A/A
false-alarm rate is zero over at least 20 runs run by default; the others are ``slow``
(`make perf`). The regression gates compare each implementation with this machine's saved run."""
from __future__ import annotations

import pytest

from bench import baselines, gates, registry, run

from .conftest import GATE_RESULTS, all_records

GATES = gates.load()


def _quiet(g: gates.Gate) -> bool:
    return g.quiet() and all(registry.benches()[b].device == "cpu" for b in g.benches)


def _param(g: gates.Gate):
    marks = [] if _quiet(g) else [pytest.mark.slow]
    if any(registry.benches()[b].device == "gpu" for b in g.benches):
        marks.append(pytest.mark.gpu)
    return pytest.param(g, id=g.name, marks=marks)


def _decide(result: dict) -> None:
    GATE_RESULTS.append(result)
    if result["verdict"] in ("skip", "ambiguous"):
        pytest.skip(result["reason"])
    assert result["verdict"] != "fail", (
        f"{result['gate']}: ratio {result['ratio']:.3f}, gate {result['direction']} {result['threshold']} "
        f"(spread {result['spread']}) {result['reason']}")


@pytest.mark.parametrize("gate", [_param(g) for g in GATES])
def test_gate(gate, perf_session):
    records = perf_session.need(*sorted(gate.benches))
    _decide(gates.judge(gate, records, run.remeasurer(records)))


@pytest.mark.slow
@pytest.mark.parametrize("bench,shape,impl", [r for r in all_records()
                                               if registry.impls(r[0])[r[2]].role in baselines.GATED_ROLES])
def test_regression(bench, shape, impl, perf_session):
    records = perf_session.need(bench)
    rec = records.get(f"{bench}/{shape}/{impl}")
    if rec is None or rec.skip is not None:
        pytest.skip(rec.skip if rec else "not measured")
    _decide(baselines.regression(rec, run.remeasurer(records)))
