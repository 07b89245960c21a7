"""Backend declarations: rounding models are named per family and checked at registration; family
discovery finds the packages; the executor's memo never hands back a stale oracle."""
import numpy as np
import pytest

from conformance import families, registry
from conformance.families import gdn, turboquant
from conformance.memo import Memo, digest
from conformance.registry import Backend


def _backend(**kw):
    base = dict(name="decl-test", ops={"turboquant": ("decode",)}, available=lambda: (True, "yes"),
                run=lambda cell, inputs: {})
    return Backend(**{**base, **kw})


def test_an_unknown_rounding_model_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown turboquant rounding model 'bf16-operands'") as err:
        registry.validate(_backend(rounding_models={"turboquant": "bf16-operands"}))
    for model in turboquant.ROUNDING_MODELS:
        assert model in str(err.value)


def test_unknown_families_ops_and_stray_models_are_refused():
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        registry.validate(_backend(ops={"nope": ("decode",)}))
    with pytest.raises(ValueError, match="unknown turboquant ops"):
        registry.validate(_backend(ops={"turboquant": ("prefill",)}))
    with pytest.raises(ValueError, match="leave out"):
        registry.validate(_backend(rounding_models={"gdn": "exact"}))


def test_a_family_left_out_of_rounding_models_is_held_to_exact():
    backend = _backend()
    registry.validate(backend)
    assert backend.rounding_model("turboquant") == "exact"
    assert registry.get("cpu-avx512").rounding_model("gdn") == "bf16-operands"


def test_every_registered_backend_names_known_models():
    for backend in registry.builtin().values():
        for family in backend.ops:
            assert backend.rounding_model(family) in families.get(family).ROUNDING_MODELS


def test_builtin_holds_this_packages_backends_and_not_those_a_test_registered(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    import tests.engine.toy_backends  # noqa: F401  (registers the toy backends in this process)

    ours = registry.builtin()
    assert "toy-good" in registry.backends() and "toy-good" not in ours
    assert {"numpy-ref", "cpu-scalar", "triton-gdn", "vllm-cpu-gdn"} <= set(ours)


def test_discovery_finds_the_family_packages_with_the_whole_protocol():
    found = families.families()
    assert found["gdn"] is gdn and found["turboquant"] is turboquant
    for fam in found.values():
        for name in families.PROTOCOL:
            assert hasattr(fam, name), (fam.FAMILY, name)


def test_test_provided_family_modules_are_discovered(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    toy = families.get("toy")
    assert toy.OPS == ("scale",) and "exact" in toy.ROUNDING_MODELS


def test_the_memo_keys_on_the_inputs_so_an_oracle_is_never_stale(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    toy = families.get("toy")
    cell = toy.cells("smoke")[0]
    memo = Memo()
    a = toy.make_inputs(cell)
    b = {**a, "x": a["x"] + np.float32(1.0)}
    good_for_b = {"y": (b["x"] * np.float32(b["factor"])).astype(np.float32)}
    assert toy.check(cell, "exact", a, {"y": (a["x"] * np.float32(a["factor"]))}, memo).status == "pass"
    assert toy.check(cell, "exact", b, good_for_b, memo).status == "pass"   # not a's oracle
    assert toy.check(cell, "exact", a, good_for_b, memo).status == "fail"
    assert len(memo) == 2


def test_digest_sees_dtype_shape_and_bytes():
    x = np.arange(6, dtype=np.float32)
    assert digest({"x": x}) == digest({"x": x.copy()})
    assert digest({"x": x}) != digest({"x": x.astype(np.float64)})
    assert digest({"x": x}) != digest({"x": x.reshape(2, 3)})
    assert digest({"x": x, "s": None}) != digest({"x": x, "s": 0})


def test_memo_draws_inputs_once_and_forgets_them_past_its_size(monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    toy = families.get("toy")
    c0, c1, c2 = toy.cells("smoke")
    drawn = []

    def make(cell):
        drawn.append(cell)
        return toy.make_inputs(cell)

    memo = Memo(size=2)
    x = memo.inputs(c0, make)
    assert memo.inputs(c0, make) is x and drawn == [c0]
    memo.inputs(c1, make)
    memo.inputs(c2, make)                      # c0's inputs are evicted
    assert memo.inputs(c0, make) is not x and drawn == [c0, c1, c2, c0] and len(memo) == 2


def test_the_worker_runs_a_pair_only_under_its_backends_env(monkeypatch):
    """``Backend.env`` is enforced once, where a pair runs (``inprocess.run_one``): a backend that needs the
    Triton interpreter is an ``error`` naming the variable in a process without it, and never runs."""
    from conformance.run.inprocess import run_one

    ran = []
    backend = _backend(name="env-test", ops={"gdn": ("gating",)}, env=registry.INTERPRET_ENV,
                       run=lambda cell, inputs: ran.append(cell))
    monkeypatch.setitem(registry._REGISTRY, backend.name, backend)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cell = next(c for c in gdn.cells("smoke") if c.op == "gating")
    record = run_one(cell, backend.name)
    assert record["status"] == "error" and not ran
    assert record["reason"] == "env-test needs TRITON_INTERPRET=1 in its process (TRITON_INTERPRET unset)"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert run_one(cell, backend.name)["reason"].endswith("(TRITON_INTERPRET=0)") and not ran
