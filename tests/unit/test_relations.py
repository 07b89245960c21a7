"""Relations between runs (``conformance.relations``): the NumPy reference is batch-invariant and
deterministic bit for bit; a backend that drifts from call to call or reads another batch row is
caught, as within bound or not, by the same relations; the study writes what the report's column reads."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conformance import families, registry, relations
from conformance.registry import Backend
from reference.gdn import numpy_ref


def _backend(name, change):
    """A numpy-ref twin whose outputs pass through ``change(cell, outputs, call)`` (call: 0, 1, ...)."""
    calls = []

    def run(cell, inputs):
        out = families.get("gdn").run_with(numpy_ref, cell, inputs)
        calls.append(cell.id)
        return change(cell, out, len(calls) - 1)
    return Backend(name=name, ops={"gdn": ("decode",)}, available=lambda: (True, "test"), run=run,
                   rounding_models={"gdn": "exact"})


@pytest.fixture
def registered(monkeypatch):
    def add(backend):
        monkeypatch.setitem(registry._REGISTRY, backend.name, backend)
        return relations.Relations(backend.name)
    return add


def test_the_reference_is_batch_invariant_and_deterministic_bit_for_bit():
    r = relations.Relations("numpy-ref")
    assert r.batch()["verdict"] == "bitwise"
    assert r.determinism()["verdict"] == "bitwise"


def test_split_and_rollback_of_the_reference_hold_within_its_bound():
    r = relations.Relations("numpy-ref")
    assert r.split()["verdict"] in ("bitwise", "within bound")
    assert r.rollback()["verdict"] in ("bitwise", "within bound")


def test_drift_from_call_to_call_is_within_bound_or_not_by_its_size(registered):
    def drift(scale):
        def change(cell, out, call):
            return {**out, "o": np.asarray(out["o"], np.float32) * np.float32(1 + scale * call)}
        return change
    assert registered(_backend("test-drift-ulp", drift(2.0**-23))).determinism()["verdict"] == "within bound"
    assert registered(_backend("test-drift-big", drift(1e-2))).determinism()["verdict"] == "not"


def test_a_result_that_depends_on_the_batch_is_not_batch_invariant(registered):
    def by_batch(cell, out, call):          # o scaled by the batch size: right alone, wrong in a batch
        return {**out, "o": np.asarray(out["o"], np.float32) * np.float32(1 + 0.1 * (cell["N"] - 1))}
    r = registered(_backend("test-batch-dependent", by_batch))
    assert r.batch()["verdict"] == "not"
    assert r.rollback() == {"verdict": "n/a", "reason": "needs spec_decode and a prefill op", "ops": {}}


def test_worst_ranks_verdicts_and_ignores_not_applicable():
    assert relations.worst(["bitwise", "n/a", "within bound"]) == "within bound"
    assert relations.worst(["n/a"]) == "n/a"
    assert relations.worst(["bitwise", "not"]) == "not"


def test_the_study_gives_the_column_the_report_shows(tmp_path):
    from conformance.studies import relations as study
    from reports import studies

    class Args:
        backend, timeout = "numpy-ref", 600
    study.check(Args)
    result = study.run(Args)
    path = tmp_path / "study-relations.json"
    path.write_text(json.dumps(result))
    column = studies.relations([path])
    assert column["numpy-ref"].startswith("batch: bitwise; split: ")
    assert studies.render([path]) == ([], [])


def test_the_study_names_an_unknown_backend():
    from conformance.studies import relations as study

    class Args:
        backend, timeout = "numpy-ref,no-such", 10
    with pytest.raises(ValueError, match="--backend"):
        study.check(Args)
