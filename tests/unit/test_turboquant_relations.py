"""TurboQuant relations between runs (``conformance.turboquant_relations``): the NumPy reference
is batch-invariant, split-invariant in its store and deterministic bit for bit; a decode whose output
depends on the batch, a store whose bytes depend on the call it came in, and a decode that drifts from
call to call are caught; the study's column carries the TurboQuant relations beside the GDN ones."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conformance import families, registry
from conformance import turboquant_relations as relations
from conformance.registry import Backend
from reference.turboquant import numpy_ref


def _backend(name, change):
    """A numpy-ref twin (TurboQuant store and decode) whose outputs pass through ``change(cell, inputs, outputs,
    call)`` (call: 0, 1, ...)."""
    calls = []

    def run(cell, inputs):
        out = families.get("turboquant").run_with(numpy_ref, cell, inputs)
        calls.append(cell.id)
        return change(cell, inputs, out, len(calls) - 1)
    return Backend(name=name, ops={"turboquant": ("store", "decode")}, available=lambda: (True, "test"), run=run,
                   rounding_models={"turboquant": "exact"})


@pytest.fixture
def registered(monkeypatch):
    def add(backend):
        monkeypatch.setitem(registry._REGISTRY, backend.name, backend)
        return relations.TurboQuantRelations(backend.name)
    return add


def test_the_reference_holds_every_turboquant_relation_bit_for_bit():
    found = relations.TurboQuantRelations("numpy-ref").all()
    assert {name: r["verdict"] for name, r in found.items()} == {name: "bitwise" for name in relations.RELATIONS}


def test_a_decode_that_depends_on_the_batch_is_not_batch_invariant(registered):
    def by_batch(cell, inputs, out, call):     # right alone, scaled in a batch
        if "out" not in out:
            return out
        return {**out, "out": np.asarray(out["out"], np.float32) * np.float32(1 + 0.1 * (len(cell["lens"]) - 1))}
    assert registered(_backend("test-tq-batch", by_batch)).tq_batch()["verdict"] == "not"


def test_a_store_whose_bytes_depend_on_the_call_is_not_split_invariant(registered):
    def first_slot_zeroed(cell, inputs, out, call):    # every call's first stored slot loses its bytes
        if "kv_cache" not in out:
            return out
        cache = np.array(out["kv_cache"], copy=True)
        slot = int(inputs["slot_mapping"][inputs["slot_mapping"] >= 0][0])
        cache.reshape(-1, *cache.shape[2:])[slot] = 0
        return {**out, "kv_cache": cache}
    r = registered(_backend("test-tq-split", first_slot_zeroed))
    assert r.tq_split()["verdict"] == "not"


def test_a_decode_that_drifts_from_call_to_call_is_within_bound_or_not_by_its_size(registered):
    def drift(scale):
        def change(cell, inputs, out, call):
            if "out" not in out:
                return out
            return {**out, "out": np.asarray(out["out"], np.float32) * np.float32(1 + scale * call)}
        return change
    small = registered(_backend("test-tq-drift-ulp", drift(2.0 ** -23))).tq_determinism()
    assert small["verdict"] == "within bound" and small["ops"] == {"store": "bitwise", "decode": "within bound"}
    assert registered(_backend("test-tq-drift-big", drift(1e-2))).tq_determinism()["verdict"] == "not"


def test_the_study_column_carries_the_turboquant_relations(tmp_path):
    from conformance.studies import relations as study
    from reports import studies

    class Args:
        backend, timeout = "numpy-ref", 900
    study.check(Args)
    result = study.run(Args)
    path = tmp_path / "study-relations.json"
    path.write_text(json.dumps(result))
    column = studies.relations([path])["numpy-ref"]
    assert "tq-batch: bitwise; tq-split: bitwise; tq-determinism: bitwise" in column
