"""vLLM's GDN adapter (conformance/backends/vllm_gdn.py) without running vLLM's kernels: both backends are
judged under the "carried-state" rounding model, whose spec decode carries the state unrounded across a
sequence's draft tokens as vLLM's kernel does, and which differs from "exact" by more than the exact state
bound where a 16-bit pool rounds several drafts at zero decay; the rows of padding sequences, which vLLM's
kernels leave unwritten, are zeroed and warned about in decode, spec decode and recurrent alike."""
import types

import numpy as np
import pytest

from conformance import registry
from conformance.backends import vllm_gdn
from conformance.families import gdn
from conformance.families.gdn.models import MODELS
from conformance.testing import reference_impl

CELLS = {c.id: c for c in gdn.cells("ci")}
# a float16 pool, up to 4 drafts, zero decay: every stored copy's rounding is remembered
SEVERAL_DRAFTS = ("gdn/spec_decode/state=float16/H=16/HV=32/K=64/drafts=1+3+4/accepted=mix/decay=zero/"
                  "slots=shuffled/qk=large/act=float32/seed=0")
FP32_POOL = ("gdn/spec_decode/state=float32/H=4/HV=4/K=64/drafts=4/accepted=0/decay=weak/slots=shuffled/"
             "qk=unit/act=float32/seed=0")


def _outputs(model: str, cell_id: str) -> dict:
    cell = CELLS[cell_id]
    return gdn.run_with(reference_impl("gdn", model), cell, gdn.make_inputs(cell))


def test_both_backends_declare_the_carried_state_model():
    for name in ("vllm-gdn", "vllm-gdn-interpret"):
        assert registry.get(name).rounding_model("gdn") == "carried-state"
    assert MODELS["carried-state"].differs_on == ("spec_decode",)


def test_carried_state_and_exact_tell_each_other_apart_on_a_16bit_pool_with_several_drafts():
    cell = CELLS[SEVERAL_DRAFTS]
    inputs = gdn.make_inputs(cell)
    carried, exact = _outputs("carried-state", SEVERAL_DRAFTS), _outputs("exact", SEVERAL_DRAFTS)
    assert gdn.check(cell, "carried-state", inputs, carried).status == "pass"
    assert gdn.check(cell, "exact", inputs, exact).status == "pass"
    judged = gdn.check(cell, "exact", inputs, carried)
    assert judged.status == "fail" and "state: rel_l2" in judged.reason, judged.reason
    assert gdn.check(cell, "carried-state", inputs, exact).status == "fail"


def test_carried_state_is_exact_on_a_float32_pool():
    carried, exact = _outputs("carried-state", FP32_POOL), _outputs("exact", FP32_POOL)
    for name in ("o", "state"):
        np.testing.assert_array_equal(carried[name], exact[name])


def _fake_kernels(monkeypatch, fill):
    """vLLM's two kernel entry points replaced by ones that write ``fill`` into the rows of sequences with a
    real slot (vLLM's slot > 0) and leave NaN in the rest, as an unwritten ``new_empty`` may hold."""
    import torch

    def rows_of(cu, slots):
        cu = cu.numpy()
        return np.concatenate([np.arange(cu[n], cu[n + 1]) for n in range(len(cu) - 1) if slots[n] > 0]
                              or [np.zeros(0, np.int64)])

    def gating(q, v, cu_seqlens, ssm_state_indices, num_accepted_tokens, **_):
        idx = ssm_state_indices.numpy()
        slots = idx if idx.ndim == 1 else idx[np.arange(len(idx)), num_accepted_tokens.numpy() - 1]
        o = torch.full((1, *v.shape), float("nan"))
        o[0, 0, rows_of(cu_seqlens, slots)] = fill
        return o, None

    def recurrent(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
                  use_qk_l2norm_in_kernel):
        o = torch.full(v.shape, float("nan"))
        o[0, rows_of(cu_seqlens, ssm_state_indices.numpy())] = fill
        T, HV, V, K = v.shape[1], *initial_state.shape[1:]
        return o, torch.zeros(T, HV, V, K, dtype=initial_state.dtype)

    modules = {"gating": types.SimpleNamespace(fused_sigmoid_gating_delta_rule_update=gating),
               "recurrent": types.SimpleNamespace(fused_recurrent_gated_delta_rule=recurrent)}
    monkeypatch.setattr(vllm_gdn, "kernel_modules", lambda: modules)


@pytest.mark.parametrize("op", ["decode", "spec_decode", "recurrent"])
def test_padding_rows_left_unwritten_are_zeroed_and_warned_about(monkeypatch, op):
    _fake_kernels(monkeypatch, fill=1.0)
    rng = np.random.default_rng(0)
    H, HV, K, slots = 1, 2, 4, 3
    cu = np.array([0, 1, 2, 3]) if op == "decode" else np.array([0, 2, 3, 6])
    T, N = cu[-1], len(cu) - 1
    q, k = rng.standard_normal((2, T, H, K), np.float32)
    v = rng.standard_normal((T, HV, K), np.float32)
    a, b = rng.standard_normal((2, T, HV), np.float32)
    A_log, dt_bias = np.zeros(HV, np.float32), np.zeros(HV, np.float32)
    state = np.zeros((slots, HV, K, K), np.float32)
    idx = np.array([0, -1, 2])                             # the middle sequence is padding
    impl = vllm_gdn.VllmGdnImpl("cpu")
    with pytest.warns(UserWarning, match="leave its output rows unwritten"):
        if op == "decode":
            o, _ = impl.decode(q, k, v, A_log, a, b, dt_bias, state, idx)
        elif op == "spec_decode":
            spec = np.array([[0, 1, -1], [-1, -1, -1], [2, -1, -1]])
            o, _ = impl.spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec, np.ones(N, np.int32), cu)
        else:
            o, _ = impl.recurrent(q, k, v, a, b, cu, state, idx)
    padding = np.arange(cu[1], cu[2])
    assert np.all(o[padding] == 0)
    assert np.all(np.delete(o, padding, axis=0) == 1.0)
