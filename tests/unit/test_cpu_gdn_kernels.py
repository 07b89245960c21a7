"""Properties of the C++ GDN kernels (optimized.cpu) on every ISA this CPU runs.

State rounding is bit-exact RNE (vector body and scalar tail), the bf16 GEMM matches a NumPy
product of bf16-rounded operands, results do not depend on the thread count, the framework
(NumPy / uint16 views / torch / JAX) or the slot stride, concurrent callers and a forked child
are served by the persistent worker pool, and planted bugs in a kernel's use fail at least one
ci-tier gdn cell under the family's check.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import optimized.cpu as cpu
from conformance import registry
from conformance.backends.cpu_kernels import KernelImpl
from conformance.families import gdn
from conformance.numerics import U32
from conformance.testing import PLANTED, first_failing_cell

BUILT, WHY = cpu.extension_status()
pytestmark = pytest.mark.skipif(not BUILT, reason=WHY)
STATUS = cpu.isa_status()
ISAS = [pytest.param(isa, marks=pytest.mark.skipif(not STATUS[isa][0], reason=f"{isa}: {STATUS[isa][1]}"))
        for isa in cpu.ISAS]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _store_probe(isa: str, values: np.ndarray, state_dtype) -> np.ndarray:
    """Decode one token so that the new state row 0 equals ``values`` in fp32 before rounding:
    zero state, k = e0 without l2norm, beta = sigmoid(30) = 1, alpha = exp(-softplus(-60)) = 1.
    Returns the stored row."""
    V = values.size
    K, H = 4, 1
    q = np.zeros((1, H, K), np.float32)
    k = np.zeros((1, H, K), np.float32)
    k[0, 0, 0] = 1.0
    v = values.reshape(1, 1, V).astype(np.float32)
    state = np.zeros((1, 1, K, V), state_dtype)
    cpu.gdn_decode(q, k, v, np.zeros(1, np.float32), np.full((1, 1), -60.0, np.float32),
                   np.full((1, 1), 30.0, np.float32), np.zeros(1, np.float32), state,
                   np.zeros(1, np.int32), scale=1.0, use_qk_l2norm=False, isa=isa, num_threads=1)
    assert not np.any(state[0, 0, 1:].astype(np.float32)), "rows other than 0 must stay zero"
    return state[0, 0, 0]


def _rounding_values(dtype) -> np.ndarray:
    """40 values (32 through the vector body, 8 through the scalar tail): random, exact ties
    (odd and even), and for fp16 subnormals and overflow to inf."""
    rng = np.random.default_rng(7)
    x = (rng.normal(size=40) * 10).astype(np.float32)
    bits = x.view(np.uint32)
    if dtype == BF16:
        bits[0:6] = (bits[0:6] & 0xFFFF0000) | 0x8000           # halfway ties
        bits[34:38] = (bits[34:38] & 0xFFFF0000) | 0x8000       # ties in the tail
    else:
        x[0:4] = [1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65520.0, -70000.0]   # ties, overflow
        x[4:8] = [3e-6, -1e-7, 2.0 ** -25, 6e-8]                               # subnormals
        x[36:40] = [1.0 + 2.0 ** -11, 65519.0, 1e-6, -3e-7]
    return x


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("state_dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_state_store_is_round_to_nearest_even(isa, state_dtype):
    values = _rounding_values(state_dtype)
    stored = _store_probe(isa, values, state_dtype)
    with np.errstate(over="ignore"):  # 65520 and -70000 overflow to inf in fp16, as they must
        want = values.astype(state_dtype)
    np.testing.assert_array_equal(stored.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,Kd", [(32, 32, 32), (64, 128, 64), (128, 64, 128)])
def test_bf16_gemm_matches_rounded_operands(isa, M, N, Kd):
    rng = np.random.default_rng(M + N + Kd)
    a = rng.normal(size=(M, Kd)).astype(np.float32)
    b = rng.normal(size=(Kd, N)).astype(np.float32)
    ar, br = (x.astype(BF16).astype(np.float64) for x in (a, b))
    want = ar @ br
    bound = 2 * Kd * U32 * (np.abs(ar) @ np.abs(br))    # fp32 accumulation of Kd products
    got = cpu.gemm_bf16(a, b, isa=isa)
    assert np.all(np.abs(got - want) <= bound)
    # Unrounded fp32 operands would miss by ~2^-9 relative: the bound is far tighter than that.
    assert np.any(np.abs(a.astype(np.float64) @ b - want) > bound)


def _chunk_case(state_dtype, T=(70, 130), H=2, HV=4, K=64, seed=1):
    rng = np.random.default_rng(seed)
    Tn = sum(T)
    args = dict(
        q=rng.normal(size=(Tn, H, K)).astype(np.float32), k=rng.normal(size=(Tn, H, K)).astype(np.float32),
        v=rng.normal(size=(Tn, HV, K)).astype(np.float32),
        g=-rng.uniform(1e-3, 0.3, (Tn, HV)).astype(np.float32),
        beta=rng.uniform(0.1, 0.9, (Tn, HV)).astype(np.float32),
        cu_seqlens=np.concatenate([[0], np.cumsum(T)]).astype(np.int32))
    state = rng.normal(size=(len(T) + 1, HV, K, K)).astype(np.float32).astype(state_dtype)
    return args, state, np.arange(len(T), dtype=np.int32)[::-1].copy()


def _decode_case(state_dtype, N=5, H=2, HV=6, K=64, V=48, seed=2):
    rng = np.random.default_rng(seed)
    args = dict(q=rng.normal(size=(N, H, K)).astype(np.float32), k=rng.normal(size=(N, H, K)).astype(np.float32),
                v=rng.normal(size=(N, HV, V)).astype(np.float32), A_log=rng.normal(size=HV).astype(np.float32),
                a=rng.normal(size=(N, HV)).astype(np.float32), b=rng.normal(size=(N, HV)).astype(np.float32),
                dt_bias=rng.normal(size=HV).astype(np.float32))
    state = rng.normal(size=(N + 2, HV, K, V)).astype(np.float32).astype(state_dtype)
    idx = np.array([3, -1, 0, 6, 2], np.int32)
    return args, state, idx


@pytest.mark.parametrize("isa", ISAS)
def test_results_do_not_depend_on_thread_count(isa):
    args, state, idx = _chunk_case(BF16)
    s1, s2 = state.copy(), state.copy()
    o1 = cpu.gdn_chunk_prefill(**args, state=s1, state_indices=idx, isa=isa, num_threads=1)
    o2 = cpu.gdn_chunk_prefill(**args, state=s2, state_indices=idx, isa=isa, num_threads=2)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(s1.view(np.uint16), s2.view(np.uint16))
    dargs, dstate, didx = _decode_case(np.float16)
    d1, d2 = dstate.copy(), dstate.copy()
    np.testing.assert_array_equal(cpu.gdn_decode(**dargs, state=d1, state_indices=didx, isa=isa, num_threads=1),
                                  cpu.gdn_decode(**dargs, state=d2, state_indices=didx, isa=isa, num_threads=3))
    np.testing.assert_array_equal(d1.view(np.uint16), d2.view(np.uint16))


@pytest.mark.parametrize("isa", ISAS)
def test_stage_clocks_count_only_in_a_clocked_build(isa):
    """The chunked prefill's stage clocks: a build with GDN_STAGE_CLOCKS (bench.probes.gdn_prefill_stages)
    counts time in every stage a call passes through; any other build counts nothing."""
    ext = cpu._ext()
    args, state, idx = _chunk_case(BF16)
    ext.chunk_stage_clocks(True)
    cpu.gdn_chunk_prefill(**args, state=state, state_indices=idx, isa=isa)
    clocks = ext.chunk_stage_clocks(True)
    if ext.STAGE_CLOCKS:
        assert all(s > 0 for s in clocks.values()), clocks
    else:
        assert not any(clocks.values()), clocks


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("state_dtype", [np.float32, BF16, np.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("V", [200, 64, 23])
def test_decode_plans_give_the_same_bits(isa, state_dtype, V, monkeypatch):
    # V=200: three whole column blocks and a tail; 23: one partial block; padding sequence and shuffled slots.
    args, state, idx = _decode_case(state_dtype, K=37, V=V)
    runs = {}
    for plan in cpu.DECODE_PLANS:
        monkeypatch.setenv("KERNEL_LAB_GDN_DECODE_PLAN", plan)
        s = state.copy()
        o = cpu.gdn_decode(**args, state=s, state_indices=idx, isa=isa, num_threads=2, out_dtype="float32")
        runs[plan] = (o.view(np.uint32), s.view(np.uint16 if s.itemsize == 2 else np.uint32))
    o0, s0 = runs["pipelined"]
    assert not np.array_equal(s0, state.view(s0.dtype)), "the decode left the pool unchanged"
    for plan, (o, s) in runs.items():
        np.testing.assert_array_equal(o, o0, err_msg=f"output of plan {plan}")
        np.testing.assert_array_equal(s, s0, err_msg=f"state of plan {plan}")


def test_unknown_decode_plan_is_refused_by_name(monkeypatch):
    args, state, idx = _decode_case(np.float32)
    monkeypatch.setenv("KERNEL_LAB_GDN_DECODE_PLAN", "diagonal")
    with pytest.raises(ValueError, match="KERNEL_LAB_GDN_DECODE_PLAN"):
        cpu.gdn_decode(**args, state=state, state_indices=idx)


def test_concurrent_callers_share_the_worker_pool():
    """The module releases the GIL and keeps its worker threads across calls: calls from four
    Python threads at once, with different thread counts, all give the one-thread result."""
    import threading

    dargs, dstate, didx = _decode_case(BF16)
    want_state = dstate.copy()
    want = cpu.gdn_decode(**dargs, state=want_state, state_indices=didx, num_threads=1)
    bad = []

    def caller(threads):
        for _ in range(10):
            st = dstate.copy()
            out = cpu.gdn_decode(**dargs, state=st, state_indices=didx, num_threads=threads)
            if not (np.array_equal(out, want) and np.array_equal(st.view(np.uint16), want_state.view(np.uint16))):
                bad.append(threads)

    callers = [threading.Thread(target=caller, args=(n,)) for n in (2, 3, 4, 2)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert not bad, f"calls with these thread counts differed from one thread: {bad}"


def test_forked_child_runs_kernels_after_the_parent_started_workers():
    """A child forked after the pool started (its workers do not exist there) gets a fresh pool
    instead of waiting forever on the parent's."""
    import os
    import signal
    import time

    dargs, dstate, didx = _decode_case(np.float32)
    want = cpu.gdn_decode(**dargs, state=dstate.copy(), state_indices=didx, num_threads=3)
    pid = os.fork()
    if pid == 0:  # child: exit status 0 only if the multi-threaded call returns the same answer
        out = cpu.gdn_decode(**dargs, state=dstate.copy(), state_indices=didx, num_threads=3)
        os._exit(0 if np.array_equal(out, want) else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:  # a child stuck on the parent's pool: fail, do not hang
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not finish its decode within 60 s")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("isa", ISAS)
def test_padded_slot_stride_and_padding_sequence(isa):
    """A pool that is a view with a larger slot stride gives the same result; slot -1 touches nothing."""
    args, state, idx = _decode_case(BF16)
    big = np.zeros((state.shape[0], state.shape[1] + 3) + state.shape[2:], BF16)
    big[:, : state.shape[1]] = state
    view = big[:, : state.shape[1]]
    o_compact = cpu.gdn_decode(**args, state=state, state_indices=idx, isa=isa, out_dtype="float32")
    o_view = cpu.gdn_decode(**args, state=view, state_indices=idx, isa=isa, out_dtype="float32")
    np.testing.assert_array_equal(o_compact, o_view)
    np.testing.assert_array_equal(state.view(np.uint16), view.view(np.uint16))
    assert not np.any(big[:, state.shape[1]:].astype(np.float32)), "padding between slots was written"
    assert not np.any(o_compact[1]), "the padding sequence's output row must be zero"


@pytest.mark.parametrize("isa", ISAS)
def test_frameworks_agree(isa):
    """NumPy (ml_dtypes bf16), NumPy uint16 views, torch bf16 and JAX inputs give the same bits."""
    torch = pytest.importorskip("torch")
    args, state, idx = _chunk_case(BF16, T=(64, 3))
    bf = {n: (x.astype(BF16) if x.dtype == np.float32 and n != "g" else x) for n, x in args.items()}
    runs = {}
    s = state.copy()
    runs["numpy"] = (cpu.gdn_chunk_prefill(**bf, state=s, state_indices=idx, isa=isa).view(np.uint16), s)
    s = state.copy()
    u16 = {n: (x.view(np.uint16) if x.dtype == BF16 else x) for n, x in bf.items()}
    o = cpu.gdn_chunk_prefill(**u16, state=s.view(np.uint16), state_indices=idx, isa=isa)
    assert o.dtype == np.uint16
    runs["uint16"] = (o, s)
    st = torch.from_numpy(state.view(np.uint16).copy()).view(torch.bfloat16)
    tin = {n: (torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16) if x.dtype == BF16
               else torch.from_numpy(x)) for n, x in bf.items()}
    o = cpu.gdn_chunk_prefill(**tin, state=st, state_indices=torch.from_numpy(idx), isa=isa)
    assert o.dtype == torch.bfloat16
    runs["torch"] = (o.view(torch.int16).numpy().view(np.uint16), st.view(torch.int16).numpy().view(BF16))
    jnp = pytest.importorskip("jax.numpy")
    s = state.copy()
    o = cpu.gdn_chunk_prefill(**{n: jnp.asarray(x) for n, x in bf.items()}, state=s, state_indices=idx, isa=isa)
    runs["jax"] = (np.asarray(o).view(np.uint16), s)
    want_o, want_s = runs.pop("numpy")
    for name, (o, s) in runs.items():
        np.testing.assert_array_equal(o, want_o, err_msg=name)
        np.testing.assert_array_equal(s.view(np.uint16), want_s.view(np.uint16), err_msg=name)


# ---------------------------------------------------------------- planted bugs

@pytest.mark.parametrize("bug,op,states", [
    ("gdn.head-mapping-tiled", "chunked", ("bfloat16",)),
    ("gdn.head-mapping-tiled", "decode", ("float32",)),
    ("gdn.truncating-store", "decode", ("bfloat16",)),
    ("gdn.decode-state-through-bf16", "decode", ("float32",)),  # fp32-size: the exact model's bound on decode
    ("gdn.chunk-update-skipped", "chunked", ("float16",)),
    ("gdn.o-from-stored-state", "decode", ("bfloat16", "float16")),  # the o rel_l2 bound of a 16-bit pool
])
def test_planted_bug_fails_a_ci_cell(bug, op, states):
    isa = next(isa for isa in cpu.ISAS if STATUS[isa][0])
    planted = PLANTED[bug]
    cells = [c for c in gdn.cells("ci") if c.op == op and c["state"] in states and planted.applies(c)]
    model = registry.get(f"cpu-{isa}").rounding_model("gdn")
    assert first_failing_cell(planted.plant(KernelImpl(isa)), "gdn", model, cells), f"{bug} passed every ci {op} cell"
