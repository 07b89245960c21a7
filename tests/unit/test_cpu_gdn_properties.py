"""Property-based tests of the C++ GDN launchers (``optimized.cpu``): hypothesis draws small
arguments, valid and invalid.

- Valid: o and the written state slots match the NumPy reference (float64, the kernel's rounding
  model) under the gdn family's tolerances, compared by ``conformance.compare``.
- Invalid: ValueError or TypeError whose message starts with the argument's name; the NumPy
  reference, given the same bad argument, raises the same exception type naming the same argument.
- Guard bytes, valid or not: the state pool is a strided view into a larger buffer (padding
  between slots, spare slots, bytes before and after) and ``out`` a view into a larger buffer;
  nothing outside the slots the call owns and outside ``out`` changes.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import optimized.cpu as cpu
import reference.gdn.numpy_ref as ref
from conformance.cells import make_cell
from conformance.compare import compare
from conformance.families.gdn.models import MODELS
from conformance.families.gdn.tolerances import o_and_state
from conformance.testing import assert_close
from reference.gdn.arguments import POOL_DTYPES

BUILT, WHY = cpu.extension_status()
pytestmark = pytest.mark.skipif(not BUILT, reason=WHY)
ISAS = sorted(isa for isa, (ok, _) in cpu.isa_status().items() if ok) if BUILT else ["scalar"]
GUARD = 0xA5  # every guard byte; as float32 / bf16 / fp16 a finite number nobody computes
LEAD, TAIL = 3, 5  # guard elements before and after each output view
PROPERTY = settings(max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _written(case) -> np.ndarray:
    """The pool slots the case's call writes (sorted)."""
    owned = np.asarray(case["owned"])
    return np.unique(owned[owned >= 0])


def _family_tolerances(case, expected: dict, model: str):
    """(o, state: on the written slots) tolerances of the gdn family for the case's call, before it
    runs (the pool as given)."""
    op, dims = case["op"], case["dims"]
    family_op = "chunked" if op == "chunk_prefill" else op
    cell = make_cell("gdn", family_op, state=case["state"], H=dims["H"], HV=dims["HV"], K=dims["K"], V=dims["V"])
    inputs = {**case["args"], "state": np.array(case["args"]["state"]), "cu_seqlens": case["cu"],
              "scale": None, "use_qk_l2norm": True, "l2norm_eps": 1e-6,
              "state_dtype": case["state"], "chunk_size": 64}
    return o_and_state(cell, inputs, expected, MODELS[model], written=_written(case))


# ---------------------------------------------------------------- buffers with guard bytes

def _guarded(n: int, dtype) -> np.ndarray:
    buf = np.empty(LEAD + n + TAIL, dtype)
    buf.view(np.uint8)[:] = GUARD
    return buf


def _pool(rng, S: int, HV: int, K: int, V: int, dtype, pad: int):
    """(buffer, pool view [S, HV, K, V] with ``pad`` guard elements between slots)."""
    stride = HV * K * V + pad
    buf = _guarded(S * stride, dtype)
    item = buf.itemsize
    pool = np.lib.stride_tricks.as_strided(buf[LEAD:], (S, HV, K, V), (stride * item, K * V * item, V * item, item))
    pool[...] = (0.5 * rng.standard_normal(pool.shape)).astype(np.float32).astype(dtype)
    return buf, pool


def _out(shape) -> tuple[np.ndarray, np.ndarray]:
    n = int(np.prod(shape))
    buf = _guarded(n, np.float32)
    return buf, buf[LEAD:LEAD + n].reshape(shape)


def _owned(buf: np.ndarray, pool: np.ndarray, slots) -> np.ndarray:
    """Mask over ``buf`` of the elements of pool slots in ``slots``."""
    mask = np.zeros(buf.size, bool)
    stride = pool.strides[0] // buf.itemsize
    for s in np.asarray(slots).ravel():
        if s >= 0:
            start = LEAD + int(s) * stride
            mask[start:start + pool[0].size] = True
    return mask


def _assert_guards(before: np.ndarray, after: np.ndarray, owned: np.ndarray) -> None:
    changed = (before.view(np.uint8).reshape(before.size, -1) != after.view(np.uint8).reshape(after.size, -1)).any(1)
    outside = np.flatnonzero(changed & ~owned)
    assert outside.size == 0, f"{outside.size} elements written outside the outputs (first at {outside[:5]})"


# ---------------------------------------------------------------- cases

@st.composite
def decode_cases(draw, op: str):
    """A valid call of ``op`` ("decode", "spec_decode" or "chunk_prefill") with its buffers."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    H = draw(st.integers(1, 2))
    HV = H * draw(st.integers(1, 2))
    if op == "chunk_prefill":  # the chunk kernel: K, V multiples of 32; sequences across a chunk end
        K, V = draw(st.sampled_from([32, 64])), draw(st.sampled_from([32, 64]))
        lens = draw(st.lists(st.integers(1, 70), min_size=1, max_size=2))
        state = "float32"
    else:
        K, V = draw(st.integers(1, 40)), draw(st.integers(1, 40))
        lens = draw(st.lists(st.integers(1, 1 if op == "decode" else 3), min_size=1, max_size=3))
        state = draw(st.sampled_from(sorted(POOL_DTYPES))) if op == "decode" else "float32"
    N, T = len(lens), sum(lens)
    cols = max(lens) + (1 if op == "spec_decode" else 0)
    slots_needed = N * cols if op == "spec_decode" else N
    S = slots_needed + draw(st.integers(0, 2))
    padded = draw(st.lists(st.booleans(), min_size=N, max_size=N))
    as_lists = draw(st.booleans())  # index sequences as Python lists
    kw = dict(isa=draw(st.sampled_from(ISAS)), num_threads=draw(st.integers(1, 3)))
    a = dict(q=rng.standard_normal((T, H, K)).astype(np.float32), k=rng.standard_normal((T, H, K)).astype(np.float32),
             v=rng.standard_normal((T, HV, V)).astype(np.float32))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    if op == "chunk_prefill":
        a["g"] = -rng.uniform(0.01, 0.3, (T, HV)).astype(np.float32)
        a["beta"] = rng.uniform(0.1, 0.9, (T, HV)).astype(np.float32)
        a["cu_seqlens"] = cu
    else:
        a.update(A_log=np.log(rng.uniform(1, 16, HV)).astype(np.float32),
                 a=rng.standard_normal((T, HV)).astype(np.float32), b=rng.standard_normal((T, HV)).astype(np.float32),
                 dt_bias=(0.5 * rng.standard_normal(HV)).astype(np.float32))
    buf, pool = _pool(rng, S, HV, K, V, POOL_DTYPES[state], draw(st.integers(0, 5)))
    perm = rng.permutation(S).astype(np.int32)
    if op == "spec_decode":
        spec = perm[:N * cols].reshape(N, cols)
        acc = np.array([draw(st.integers(0, cols)) for _ in range(N)], np.int32)
        spec[np.array(padded), np.maximum(acc - 1, 0)[np.array(padded)]] = -1
        owned = np.concatenate([spec[n, :lens[n]] for n in range(N) if not padded[n]] or [np.array([], np.int32)])
        a.update(state=pool, spec_state_indices=spec, num_accepted_tokens=acc, cu_seqlens=cu)
    else:
        idx = np.where(padded, -1, perm[:N]).astype(np.int32)
        owned = idx
        a.update(state=pool, state_indices=idx)
    if as_lists:
        for name in ("state_indices", "spec_state_indices", "num_accepted_tokens", "cu_seqlens"):
            if name in a:
                a[name] = a[name].tolist()
    out_buf, out = _out((T, HV, V))
    return dict(op=op, args=a, kw=kw, buf=buf, out_buf=out_buf, out=out, owned=owned, state=state, padded=padded,
                cu=cu, dims=dict(H=H, HV=HV, K=K, V=V))


def _launch(case):
    fn = getattr(cpu, "gdn_" + case["op"])
    return fn(**case["args"], **case["kw"], out=case["out"])


def _reference(case, args=None, **extra):
    """The NumPy reference on a copy of the pool (float64; the chunk kernel's bf16 operands)."""
    a = dict(args or case["args"])
    if isinstance(a["state"], np.ndarray):
        a["state"] = np.array(a["state"], copy=True)
    opts = dict(state_dtype=case["state"], compute_dtype="float64", **extra)
    if case["op"] == "chunk_prefill":
        keys = ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "state_indices")
        return ref.chunked(*(a[n] for n in keys), operand_dtype="bfloat16", **opts), a["state"]
    return getattr(ref, case["op"])(**a, **opts), a["state"]


# ---------------------------------------------------------------- valid arguments

@pytest.mark.parametrize("op", ["decode", "spec_decode", "chunk_prefill"])
@PROPERTY
@given(data=st.data())
def test_valid_arguments_match_the_reference_and_stay_inside_the_outputs(op, data):
    case = data.draw(decode_cases(op))
    o_ref, pool_ref = _reference(case)
    model = "bf16-operands" if op == "chunk_prefill" else "exact"
    o_tol, s_tol = _family_tolerances(case, {"o": o_ref, "state": pool_ref}, model)
    before, out_before = case["buf"].copy(), case["out_buf"].copy()
    o = _launch(case)
    assert o is case["out"]
    written = _written(case)
    assert_close("o", o, o_ref, o_tol)
    assert_close("state", case["args"]["state"][written], pool_ref[written], s_tol)
    _assert_guards(before, case["buf"], _owned(case["buf"], case["args"]["state"], written))
    i = np.arange(out_before.size)
    _assert_guards(out_before, case["out_buf"], (i >= LEAD) & (i < LEAD + o.size))
    rows = np.repeat(np.asarray(case["padded"]), np.diff(case["cu"]))
    assert not o[rows].any(), "padding sequences must give zero rows"


# ---------------------------------------------------------------- invalid arguments

def _set(name, fn):
    """A mutation of argument ``name``: ``fn(case) -> new value``."""
    return lambda case: (name, fn(case))


def _poisoned(name, value):
    def fn(case):
        x = case["args"][name].copy()
        x.reshape(-1)[0] = value
        return x
    return _set(name, fn)


SHARED = {  # bad arguments the reference takes too
    "q NaN": _poisoned("q", np.nan),
    "v Inf": _poisoned("v", np.inf),
    "q as a list": _set("q", lambda c: c["args"]["q"].tolist()),
    "k shape": _set("k", lambda c: np.zeros(c["args"]["k"].shape[:2] + (c["dims"]["K"] + 1,), np.float32)),
    "scale NaN": _set("scale", lambda c: float("nan")),
    "scale Inf": _set("scale", lambda c: float("inf")),
    "scale negative": _set("scale", lambda c: -0.5),
    "l2norm_eps NaN": _set("l2norm_eps", lambda c: float("nan")),
    "state of ints": _set("state", lambda c: np.zeros(c["args"]["state"].shape, np.int16)),
}
GATED = {
    "A_log NaN": _poisoned("A_log", np.nan),
    "dt_bias shape": _set("dt_bias", lambda c: np.zeros(c["dims"]["HV"] + 1, np.float32)),
}
SLOTS = {
    "state_indices out of range": _set("state_indices", lambda c: [c["args"]["state"].shape[0]] * len(c["cu"][1:])),
    "state_indices of floats": _set("state_indices", lambda c: [0.5] * len(c["cu"][1:])),
}
LAUNCHER_ONLY = {  # arguments the reference does not have
    "num_threads 0": _set("num_threads", lambda c: 0),
    "num_threads too many": _set("num_threads", lambda c: 1025),
    "num_threads float": _set("num_threads", lambda c: 1.5),
    "isa unknown": _set("isa", lambda c: "sse"),
    "out shape": _set("out", lambda c: np.zeros(c["out"].shape[:2] + (c["out"].shape[2] + 1,), np.float32)),
    "out dtype": _set("out", lambda c: np.zeros(c["out"].shape, np.float64)),
    "out rows strided": _set("out", lambda c: np.zeros(c["out"].shape[:2] + (2 * c["out"].shape[2],),
                                                       np.float32)[..., ::2]),
    "out overlaps itself": _set("out", lambda c: _overlapping(c["out"])),
    "out read-only": _set("out", lambda c: np.lib.stride_tricks.as_strided(c["out"], writeable=False)),
    "out as a list": _set("out", lambda c: c["out"].tolist()),
    "out is v": _set("out", lambda c: c["args"]["v"]),
}
MUTATIONS = {
    "decode": {**SHARED, **GATED, **SLOTS, **LAUNCHER_ONLY},
    "spec_decode": {**SHARED, **GATED, **LAUNCHER_ONLY,
                    "num_accepted_tokens above the columns": _set("num_accepted_tokens", lambda c: [
                        np.asarray(c["args"]["spec_state_indices"]).shape[1] + 1] * len(c["cu"][1:])),
                    "cu_seqlens not increasing": _set("cu_seqlens", lambda c: [0] * len(c["cu"]))},
    "chunk_prefill": {**SHARED, **SLOTS, **LAUNCHER_ONLY,
                      "g NaN": _poisoned("g", np.nan),
                      "cu_seqlens past T": _set("cu_seqlens", lambda c: list(c["cu"][:-1]) + [int(c["cu"][-1]) + 1])},
}


def _overlapping(out: np.ndarray) -> np.ndarray:
    """``out`` with the stride of its outermost dimension longer than 1 set to 0."""
    d = next(i for i, n in enumerate(out.shape) if n > 1)
    return np.lib.stride_tricks.as_strided(out, strides=tuple(0 if i == d else s for i, s in enumerate(out.strides)))


def _names(exc: BaseException, name: str) -> bool:
    return re.match(rf"{re.escape(name)}\b", str(exc)) is not None


@pytest.mark.parametrize("op", ["decode", "spec_decode", "chunk_prefill"])
@PROPERTY
@given(data=st.data())
def test_invalid_arguments_are_refused_by_name_and_nothing_is_written(op, data):
    case = data.draw(decode_cases(op))
    label = data.draw(st.sampled_from(sorted(MUTATIONS[op])))
    assume(case["out"].size > 1 or label not in ("out rows strided", "out overlaps itself"))  # one element: any strides
    name, value = MUTATIONS[op][label](case)
    before, out_before = case["buf"].copy(), case["out_buf"].copy()
    target = case["args"] if name in case["args"] else case["kw"]
    bad = {**case, "args": dict(case["args"]), "kw": dict(case["kw"])}
    if name == "out":
        bad["out"] = value
    else:
        bad["args" if name in case["args"] else "kw"][name] = value
    with pytest.raises((ValueError, TypeError)) as refused:
        _launch(bad)
    assert _names(refused.value, name), f"{label}: {refused.value!r} does not name {name}"
    _assert_guards(before, case["buf"], np.zeros(before.size, bool))
    _assert_guards(out_before, case["out_buf"], np.zeros(out_before.size, bool))
    if label in LAUNCHER_ONLY:
        return
    extra = {name: value} if target is case["kw"] else {}
    with pytest.raises(type(refused.value)) as by_reference:
        _reference(case, bad["args"], **extra)
    assert _names(by_reference.value, name), f"{label}: the reference's {by_reference.value!r} does not name {name}"


# ---------------------------------------------------------------- the checks above can fail

@PROPERTY
@given(data=st.data())
def test_a_planted_scale_error_and_a_planted_stray_write_are_caught(data):
    """A 1% softmax-scale error fails the o comparison (float32 pool: a 16-bit pool's tie flips
    allow more); one element written past ``out`` or past the pool fails the guard check."""
    case = data.draw(decode_cases("decode"))
    assume(not all(case["padded"]) and case["state"] == "float32")
    o_ref, pool_ref = _reference(case)
    o_tol, _ = _family_tolerances(case, {"o": o_ref, "state": pool_ref}, "exact")
    o = _launch({**case, "kw": {**case["kw"], "scale": 1.01 / np.sqrt(case["dims"]["K"])}})
    assert not compare("o", o, o_ref, o_tol).passed
    before = case["out_buf"].copy()
    case["out_buf"][LEAD + o.size] = 1.0
    i = np.arange(before.size)
    with pytest.raises(AssertionError, match="written outside the outputs"):
        _assert_guards(before, case["out_buf"], (i >= LEAD) & (i < LEAD + o.size))
    before = case["buf"].copy()
    case["buf"][-1] = 1.0
    with pytest.raises(AssertionError, match="written outside the outputs"):
        _assert_guards(before, case["buf"], _owned(case["buf"], case["args"]["state"],
                                                   range(case["args"]["state"].shape[0])))
