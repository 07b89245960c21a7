"""The interpreter backends refuse, before any cell, a Triton/NumPy pair whose interpreter cannot loop a
runtime number of times: Triton 3.6's interpreter converts a scalar (an array of shape (1,)) with
``int(array)``, which NumPy 2.4 and later refuse. The tests put either conversion into this machine's
interpreter for the call, so they hold whatever Triton is installed."""
import os

import numpy as np
import pytest

from conformance import registry

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


def _refuses_shape_1_to_int() -> bool:
    try:
        int(np.array([1]))
    except TypeError:
        return True
    return False


def _index_as(monkeypatch, convert):
    """The interpreter's tensor ``__index__`` as ``convert(handle.data)`` during kernel calls."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: convert(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


@pytest.fixture
def triton36_index(monkeypatch):
    if not _refuses_shape_1_to_int():
        pytest.skip(f"numpy {np.__version__} converts an array of shape (1,) with int()")
    _index_as(monkeypatch, int)          # Triton 3.6's interpreter: int(data), data of shape (1,)


def test_the_check_names_the_pair_whose_interpreter_converts_with_int(triton36_index):
    import triton

    from conformance.triton_interpreter import runtime_loop_problem

    problem = runtime_loop_problem()
    assert problem is not None
    assert f"triton {triton.__version__} with numpy {np.__version__}" in problem
    assert "only 0-dimensional arrays" in problem and "NumPy 2.4" in problem


def test_the_check_passes_an_interpreter_that_squeezes_the_scalar(monkeypatch):
    from conformance.triton_interpreter import runtime_loop_problem

    _index_as(monkeypatch, lambda data: int(data.squeeze()))   # Triton 3.8's
    assert runtime_loop_problem() is None


def test_a_loop_that_runs_wrong_is_a_problem_too(monkeypatch):
    from conformance.triton_interpreter import runtime_loop_problem

    _index_as(monkeypatch, lambda data: int(data.squeeze()) + 1)   # one iteration too many
    assert "expected [0, 1, -1]" in runtime_loop_problem()


@pytest.mark.parametrize("name", ["triton-gdn-interpret", "triton-interpret", "vllm-gdn-interpret",
                                  "vllm-triton-tq-interpret"])
def test_interpreter_backends_are_unavailable_with_the_pair_named(triton36_index, name):
    if name.startswith("vllm"):
        pytest.importorskip("vllm")
    ok, reason = registry.backends()[name].available()
    assert not ok and f"with numpy {np.__version__}" in reason and "only 0-dimensional arrays" in reason


def test_every_interpreter_backend_makes_the_probes_tiny_call():
    """A stack that imports but cannot run is caught by the probe, before the run, not cell by cell."""
    interpreted = [b for b in registry.builtin().values() if b.env.get("TRITON_INTERPRET") == "1"]
    assert {"triton-gdn-interpret", "vllm-gdn-interpret"} <= {b.name for b in interpreted}
    assert [b.name for b in interpreted if not b.probe_call] == []
