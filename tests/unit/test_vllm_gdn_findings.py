"""vLLM's GDN adapter (conformance/backends/vllm_gdn.py) without running vLLM's kernels: its declared
known findings are ci cells where the carried-state rounding can act, declared on both backends with
their measured margins; the rows of padding sequences, which vLLM's kernels leave unwritten, are zeroed
and warned about in decode, spec decode and recurrent alike."""
import json
import pathlib
import re
import types

import numpy as np
import pytest

from conformance import registry
from conformance.backends import vllm_gdn
from conformance.families import gdn

CELLS = {c.id: c for c in gdn.cells("ci")}
H100_RECORD = pathlib.Path(__file__).parents[2] / "ledger/h100/host_ci_budget_cells.jsonl"


@pytest.mark.parametrize("cell_id", sorted(vllm_gdn.KNOWN_FINDINGS))
def test_a_known_finding_is_a_ci_cell_where_the_carried_state_rounding_can_act(cell_id):
    assert cell_id in CELLS, f"{cell_id} is no longer a ci cell: measure it again or drop it"
    cell = CELLS[cell_id]
    assert cell.op == "spec_decode"
    assert cell["state"] in ("bfloat16", "float16"), "an fp32 pool has nothing to round"
    assert max(cell["drafts"]) > 1, "one draft token: one rounding in either model"


@pytest.mark.parametrize("cell_id,reason", sorted(vllm_gdn.KNOWN_FINDINGS.items()))
def test_a_known_finding_names_the_rounding_and_its_measured_margin(cell_id, reason):
    assert reason.startswith(vllm_gdn.CARRIED_STATE)
    assert CELLS[cell_id]["state"] in reason
    m = re.search(r"rel_l2 is ([\d.]+) times its derived bound \(([\d.]+) against ([\d.]+)\)", reason)
    assert m, reason
    margin, got, bound = map(float, m.groups())
    assert margin > 1 and abs(got / bound - margin) < 0.02, (margin, got / bound)


def test_every_spec_decode_failure_of_the_h100_record_is_declared_with_its_margin():
    rows = [json.loads(line) for line in H100_RECORD.read_text().splitlines()]
    failed = [r for r in rows if r["backend"] == "vllm-gdn" and r["op"] == "spec_decode" and r["status"] == "fail"]
    assert failed
    for r in failed:
        assert r["id"] in vllm_gdn.KNOWN_FINDINGS, r["id"]
        margin = re.search(r"margin ([\d.]+) by", r["reason"]).group(1)
        assert f"is {margin} times" in vllm_gdn.KNOWN_FINDINGS[r["id"]], (r["id"], margin)


def test_both_backends_declare_the_known_findings_and_nothing_else():
    other = next(c for c in CELLS.values() if c.op == "spec_decode" and c.id not in vllm_gdn.KNOWN_FINDINGS)
    for name in ("vllm-gdn", "vllm-gdn-interpret"):
        backend = registry.get(name)
        for cell_id, reason in vllm_gdn.KNOWN_FINDINGS.items():
            assert backend.hook("xfail", CELLS[cell_id]) == reason
        assert backend.hook("xfail", other) is None


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
