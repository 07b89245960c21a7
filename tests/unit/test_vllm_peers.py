"""Peers in the default run: a named subset of vLLM's TurboQuant Triton kernels through the
interpreter (all their ci cells run in `make conform`, minutes each), and the Triton substitution
that makes vLLM's unchanged kernel modules see the real Triton."""
import contextlib
import os

import numpy as np
import pytest

from conformance import registry
from conformance.backends import vllm_gdn
from conformance.registry import INTERPRET_ENV
from conformance.families import gdn, turboquant as F
from conformance.run import probe
from conformance.run.inprocess import run_one
from tests.unit.tq_triton_helpers import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter backends run on machines without a GPU")

SUBSET = {
    "vllm-triton-tq-interpret": [
        "turboquant/store/preset=turboquant_4bit_nc/layout=aos/Hk=2/bs=64/ntok=17/rotation=hadamard/D=128/"
        "range=small-q/act=float16/seed=0",
        # head size 96: vLLM's kernels mask a power-of-two tile to D
        "turboquant/store/preset=turboquant_k3v4_nc/layout=aos/Hk=2/bs=16/ntok=9/rotation=random/D=96/"
        "range=unit/act=float16/seed=0",
    ],
    "vllm-triton-tq-soa-interpret": [
        "turboquant/store/preset=turboquant_4bit_nc/layout=soa/Hk=4/bs=32/ntok=17/rotation=random/D=128/"
        "range=wide/act=float16/seed=0",
        "turboquant/decode/preset=turboquant_3bit_nc/layout=soa/Hk=2/G=4/bs=64/lens=1+1+1+1/rotation=random/"
        "sinks=off/D=128/range=unit/act=bfloat16/seed=0",
        "turboquant/store_decode/preset=turboquant_4bit_nc/layout=soa/Hk=2/G=6/bs=32/lens=33+1/rotation=random/"
        "sinks=off/D=96/range=unit/act=bfloat16/seed=0",
    ],
    "vllm-triton-tq-unified-interpret": [
        "turboquant/decode/preset=turboquant_k8v4/layout=soa/Hk=4/G=2/bs=16/lens=9+17/rotation=none/sinks=off/"
        "D=96/range=unit/act=float16/seed=0",
    ],
}


GDN_SUBSET = [  # vllm-gdn-interpret: decode (the null slot 0 and the [V, K] pool translated) and spec decode
    "gdn/decode/state=float16/H=4/HV=12/K=64/V=32/N=1/decay=zero/slots=shuffled/qk=large/act=bfloat16/seed=0",
    "gdn/spec_decode/state=float32/H=4/HV=4/K=64/drafts=4/accepted=0/decay=weak/slots=shuffled/qk=unit/act=float32/seed=0",
]
# vLLM carries the fp32 state between draft tokens where the exact model continues from the stored value
# (conformance/backends/vllm_gdn.py): with a float16 pool at zero decay the exact state tolerance tells them apart
CARRIED_STATE_CELL = ("gdn/spec_decode/state=float16/H=16/HV=32/K=64/drafts=1+3+4/accepted=mix/decay=zero/"
                      "slots=shuffled/qk=large/act=float32/seed=0")


def _backend(name):
    ok, why = probe.probe(registry.get(name))
    if not ok:
        pytest.skip(f"{name} unavailable: {why}")


@pytest.mark.parametrize("name,cell_id", [(n, c) for n, ids in SUBSET.items() for c in ids])
def test_named_subset_passes_through_the_interpreter(name, cell_id):
    _backend(name)
    cells = {c.id: c for c in F.cells("ci")}
    assert cell_id in cells, f"{cell_id} is no longer a ci cell; pick another small one"
    record = run_one(cells[cell_id], name)
    assert record["status"] == "pass", f"{record['status']}: {record['reason']}"


def test_kernel_modules_hold_real_triton_kernels():
    _backend("vllm-triton-tq-soa-interpret")
    import types

    import triton

    from conformance.backends.vllm_triton_tq import kernel_modules

    mods = kernel_modules()
    assert mods["soa_store"].triton is triton
    # vLLM's placeholder jit returns the plain Python function; the real one wraps it
    assert not isinstance(mods["soa_store"]._tq_fused_store_mse, types.FunctionType)


@pytest.mark.parametrize("cell_id", GDN_SUBSET)
def test_vllm_gdn_subset_passes_through_the_interpreter(cell_id):
    _backend("vllm-gdn-interpret")
    cells = {c.id: c for c in gdn.cells("ci")}
    assert cell_id in cells, f"{cell_id} is no longer a ci cell; pick another small one"
    record = run_one(cells[cell_id], "vllm-gdn-interpret")
    assert record["status"] == "pass", f"{record['status']}: {record['reason']}"


@pytest.mark.slow
def test_vllm_gdn_spec_decode_carries_the_unrounded_state_between_draft_tokens():
    _backend("vllm-gdn-interpret")
    cell = {c.id: c for c in gdn.cells("ci")}[CARRIED_STATE_CELL]
    assert run_one(cell, "triton-gdn-interpret")["status"] == "pass"
    record = run_one(cell, "vllm-gdn-interpret")
    assert record["status"] == "pass" and record["rounding_model"] == "carried-state", record["reason"]
    inputs = gdn.make_inputs(cell)
    with _interpreter():
        carried = gdn.run_with(vllm_gdn.VllmGdnImpl("cpu"), cell, gdn.make_inputs(cell))
        # the same kernel called once per draft token, resuming from the stored (rounded) slot
        per_token = gdn.run_with(_PerDraftToken("cpu"), cell, gdn.make_inputs(cell))
    judged = gdn.check(cell, "exact", inputs, carried)
    assert judged.status == "fail" and "state: rel_l2" in judged.reason, judged.reason
    assert gdn.check(cell, "exact", inputs, per_token).status == "pass"


class _PerDraftToken(vllm_gdn.VllmGdnImpl):
    """Spec decode as one vLLM call per draft position: slot row [write, read] with one accepted token
    more, so the kernel resumes from the read column and stores into column 0."""

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec, acc, cu, *, scale=None, use_qk_l2norm=True,
                    **_):
        N = len(cu) - 1
        read = spec[np.arange(N), np.maximum(acc - 1, 0)].copy()
        o = np.zeros((q.shape[0], *v.shape[1:]), q.dtype)
        for t in range(int(np.max(np.diff(cu)))):
            ns = np.flatnonzero((np.diff(cu) > t) & (read >= 0))
            rows = cu[ns] + t
            pairs = np.stack([spec[ns, t], read[ns]], axis=1)
            o[rows], state = self._gated(q[rows], k[rows], v[rows], A_log, a[rows], b[rows], dt_bias, state, pairs,
                                         np.full(ns.size, 2, np.int32), np.arange(ns.size + 1), scale, use_qk_l2norm)
            read[ns] = spec[ns, t]
        return o, state


@contextlib.contextmanager
def _interpreter():
    saved = {n: os.environ.get(n) for n in INTERPRET_ENV}
    os.environ.update(INTERPRET_ENV)
    try:
        yield
    finally:
        for n, value in saved.items():
            if value is None:
                os.environ.pop(n)
            else:
                os.environ[n] = value
