"""Each planted bug in the NumPy reference must fail at least one gdn ci cell through
``gdn.check`` (the same check every backend gets), under the "exact" tolerances and under the
"bf16-operands" tolerances a CPU chunk kernel is held to, and the "bf16-gemm" tolerances of
torch-eager (which are wider than a truncating store's error: that one is a strict xfail)."""
from __future__ import annotations

import numpy as np
import pytest

import reference.gdn.numpy_ref as numpy_ref
from conformance.families import gdn


class _Bf16OperandReference:
    """numpy_ref whose chunked op uses the CPU chunk kernel's bf16 operands (the impl the
    "bf16-operands" oracle holds a kernel to)."""

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(*args, **kw):
        return numpy_ref.chunked(*args, **kw, operand_dtype="bfloat16")


MODELS = {"exact": (numpy_ref, None), "bf16-operands": (_Bf16OperandReference(), ("chunked",)),
          "bf16-gemm": (_Bf16OperandReference(), ("chunked",))}
# torch-eager's bf16 GEMM results carry ~u_bf16 noise, the size of a truncating store's error
UNDETECTABLE = {("bf16-gemm", "truncation instead of nearest-even store")}


def _tile_heads(x, HV):
    """Bug: value head hv uses key head hv % H (tile) instead of hv // (HV // H)."""
    return np.tile(x, (1, HV // x.shape[1], 1))


def _transposed_read(state, slot, cdt):
    """Bug: the slot is read as [V, K]."""
    return state[slot].swapaxes(-1, -2).astype(cdt)


def _truncating_store(S, sdt):
    """Bug: store by truncation toward zero instead of round-to-nearest-even."""
    x = np.asarray(S, np.float32)
    nearest = x.astype(sdt)
    if np.dtype(sdt).itemsize != 2:
        return nearest
    away = np.abs(nearest.astype(np.float32)) > np.abs(x)
    bits = nearest.view(np.uint16)                 # sign-magnitude: one ulp toward zero = bits - 1
    return np.where(away, bits - 1, bits).astype(np.uint16).view(sdt)


def _skip_second_chunk_update():
    """Bug: the second chunk processed keeps the state it started with."""
    original = numpy_ref._chunk_forward
    calls = []

    def chunk_forward(S, *args):
        calls.append(1)
        o, S_next = original(S, *args)
        return o, (S if len(calls) == 2 else S_next)

    return chunk_forward


PLANTED = {
    "tile instead of repeat_interleave": (("recurrent", "chunked", "decode"), "_expand_heads",
                                          lambda: _tile_heads),
    "one chunk's state update skipped": (("chunked",), "_chunk_forward", _skip_second_chunk_update),
    "truncation instead of nearest-even store": (("recurrent", "chunked", "decode", "spec_decode"),
                                                 "_to_state", lambda: _truncating_store),
    "state read transposed [V, K]": (("recurrent", "chunked", "spec_decode"), "_load_state",
                                     lambda: _transposed_read),
}


def _outputs(impl, cell, inputs):
    return gdn.run_with(impl, cell, {**inputs, "state": inputs["state"].copy()})


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_a_ci_cell_that_the_reference_passes(bug, model, monkeypatch, request):
    if (model, bug) in UNDETECTABLE:
        request.applymarker(pytest.mark.xfail(strict=True, reason="below the bf16-gemm tolerance"))
    ops, attribute, make_bug = PLANTED[bug]
    impl, model_ops = MODELS[model]
    found = None
    for cell in gdn.cells("ci"):
        if cell.op not in ops or (model_ops and cell.op not in model_ops):
            continue
        inputs = gdn.make_inputs(cell)
        with monkeypatch.context() as patch:
            patch.setattr(numpy_ref, attribute, make_bug())
            outputs = _outputs(impl, cell, inputs)
        result = gdn.check(cell, model, inputs, outputs)      # the oracle is computed unpatched
        if result.status == "fail":
            found = cell
            break
    assert found is not None, f"no gdn ci cell catches the planted bug under {model}: {bug}"
    control = gdn.check(found, model, inputs, _outputs(impl, found, inputs))
    assert control.status == "pass", f"{found.id} fails without the bug too: {control.reason}"
