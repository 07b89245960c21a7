"""Refusals as family data: every row of a family's ``REFUSALS`` (``conformance.refusals``) against every
registered backend of the family that holds the argument contract (the references, the C++ kernels, the
Triton launchers through the interpreter, the torch baselines, the FlyDSL emulation): the call raises the
row's error naming its argument and leaves the pool as it was. A backend registered tomorrow gets every row;
a family without ``REFUSALS`` has none. The cell is the smallest ci cell of the op the backend runs (one call,
no 16-bit activations, whose range would turn a spoiled value into another refusal)."""
from functools import lru_cache

import numpy as np
import pytest

from conformance import families, registry
from conformance.cells import activation
from conformance.refusals import names_argument, problem
from conformance.run.estimate import cell_work
from conformance.run.inprocess import cell_inputs


def _contract_backends(family: str):
    return sorted((b for b in registry.backends().values() if b.argument_contract and family in b.ops),
                  key=lambda b: b.name)


def _cases():
    for family, module in families.families().items():
        for refusal in getattr(module, "REFUSALS", ()):
            for backend in _contract_backends(family):
                for op in refusal.ops:
                    if op in backend.ops[family]:
                        yield pytest.param(family, op, backend.name, refusal,
                                           id=f"{family}-{op}-{backend.name}-{refusal.label}")


@lru_cache(maxsize=None)
def _runnable(name: str) -> str | None:
    backend = registry.get(name)
    wrong = backend.env_problem()
    if wrong:
        return wrong
    ok, why = backend.available()
    return None if ok else why


def _one_call(cell) -> bool:
    return cell.get("steps", 1) == 1 and cell.get("calls", 1) == 1 and cell.get("split") is None


@lru_cache(maxsize=None)
def _cell(family: str, op: str, name: str):
    backend = registry.get(name)
    cells = [c for c in families.get(family).cells("ci") if c.op == op and activation(c) != "float16" and _one_call(c)
             and backend.skip_reason(c) is None]
    return min(cells, key=cell_work) if cells else None


@pytest.mark.parametrize("family,op,backend,refusal", list(_cases()))
def test_every_implementation_refuses_the_familys_bad_inputs(family, op, backend, refusal):
    why = _runnable(backend)
    if why:
        pytest.skip(f"{backend} cannot run here: {why}")
    cell = _cell(family, op, backend)
    if cell is None:
        pytest.skip(f"{backend} runs no one-call ci cell of {family}/{op}")
    module = families.get(family)
    wrong = problem(refusal, lambda inputs: registry.get(backend).run(cell, inputs), cell_inputs(cell), module.POOL)
    assert wrong is None, f"{backend} on {cell.id}, {refusal.label}: {wrong}"


def test_the_refusal_check_has_teeth():
    """A call that accepts the input, names another argument, or writes the pool before refusing fails."""
    from conformance.families.gdn import REFUSALS

    row = next(r for r in REFUSALS if r.label == "NaN in q")
    inputs = {"q": np.zeros((2, 1, 4), np.float32), "state": np.zeros(3, np.float32)}

    def writes_then_refuses(x):
        x["state"][0] = 1.0
        raise ValueError("q holds NaN")

    assert problem(row, lambda x: None, inputs, "state") == "accepted it"
    assert "without naming 'q'" in problem(row, lambda x: (_ for _ in ()).throw(ValueError("k holds NaN")), inputs,
                                           "state")
    assert problem(row, writes_then_refuses, inputs, "state") == "refused it, but wrote into state"
    assert names_argument("A_log, a, dt_bias: the gate", "a") and not names_argument("a way", "y")


LARGE_GATES = {  # legitimate inputs near the refusals' edges: each implementation runs them, the pool stays finite
    "decode": ("a + dt_bias of 10^4 (softplus(x) = x above 20)", lambda x: _token0(x, "a", 1e4)),
    "recurrent": ("g of -10^30 (the state decays to 0)", lambda x: _token0(x, "g", -1e30)),
    "chunked": ("g of -10^30 (the state decays to 0)", lambda x: _token0(x, "g", -1e30)),
}


def _token0(x: dict, name: str, value: float) -> None:
    arr = np.array(x[name])
    arr[0] = value
    x[name] = arr


@pytest.mark.parametrize("op", list(LARGE_GATES))
@pytest.mark.parametrize("backend", [b.name for b in _contract_backends("gdn")])
def test_large_legitimate_gates_are_not_refused(op, backend):
    why = _runnable(backend)
    if why or op not in registry.get(backend).ops["gdn"]:
        pytest.skip(why or f"{backend} does not run gdn/{op}")
    cell = _cell("gdn", op, backend)
    if cell is None:
        pytest.skip(f"{backend} runs no one-call ci cell of gdn/{op}")
    inputs = dict(cell_inputs(cell))
    LARGE_GATES[op][1](inputs)
    outputs = registry.get(backend).run(cell, inputs)
    assert np.isfinite(outputs["state"]).all() and np.isfinite(np.asarray(outputs["o"], np.float32)).all()
