"""The Triton GDN kernels (``optimized.triton.gdn_recurrent``) through the interpreter on a CPU:

- planted bugs (``conformance.testing.PLANTED``) in the kernels' wrapper fail a small ci cell each;
- valid calls (hypothesis draws small decode, spec-decode and recurrent cells of the gdn family) pass the
  family's check with ``out`` and the pool as views into buffers of guard bytes (the pool's slots spaced
  apart), and nothing outside the views changes;
- bad input is refused before launch by a ValueError/TypeError whose message starts with the argument's
  name, nothing written; where the NumPy reference takes the argument it raises the same type naming it.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conformance import registry
from conformance.backends.triton_gdn import TritonGdnImpl
from conformance.cells import make_cell
from conformance.families import gdn
from conformance.run.runner import cell_work
from conformance.testing import PLANTED, first_failing_cell
from conformance.torch_arrays import to_numpy, to_torch
from optimized.triton import gdn_recurrent as K
from reference.gdn import numpy_ref
from tests.unit.tq_triton_helpers import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter runs on machines without a GPU")
GUARD, LEAD, TAIL = 0xA5, 4, 16
FEW = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck), max_examples=4)


def _t(x):
    return to_torch(x, DEVICE)


# ---------------------------------------------------------------- planted bugs

BUGS = ("gdn.head-mapping-tiled", "gdn.truncating-store", "gdn.state-read-transposed", "gdn.padding-slot-written",
        "gdn.decode-state-through-bf16", "gdn.fp16-read-as-bf16", "gdn.qk-norm-in-input-dtype")


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bugs_fail_a_small_ci_cell(bug):
    planted = PLANTED[bug]
    backend = registry.get("triton-gdn-interpret")
    cells = sorted((c for c in gdn.cells("ci") if c.op in ("decode", "spec_decode") and planted.applies(c)
                    and backend.skip_reason(c) is None), key=cell_work)[:4]
    assert cells, f"no small ci cell for {bug}"
    found = first_failing_cell(planted.plant(TritonGdnImpl("cpu")), "gdn", backend.rounding_model("gdn"), cells)
    assert found is not None, f"{bug} passed {[c.id for c in cells]}"


# ---------------------------------------------------------------- guarded views

def _guarded(shape: tuple, strides: tuple, dtype):
    """(byte buffer full of GUARD, a view of ``shape``/``strides`` in it, mask of the bytes the view owns)."""
    el = torch.empty((), dtype=dtype).element_size()
    n = sum((s - 1) * st for s, st in zip(shape, strides)) + 1
    buf = torch.full((LEAD + n * el + TAIL,), GUARD, dtype=torch.uint8)
    view = buf[LEAD:LEAD + n * el].view(dtype).as_strided(shape, strides)
    offs = torch.arange(n).as_strided(shape, strides).reshape(-1)
    owned = torch.zeros(buf.numel(), dtype=torch.bool)
    for j in range(el):
        owned[LEAD + offs * el + j] = True
    return buf, view, owned


def _cell(draw, op: str):
    state, act = draw(st.sampled_from(["float32", "bfloat16", "float16"])), draw(st.sampled_from(
        ["bfloat16", "float16", "float32"]))
    H = draw(st.sampled_from([1, 2]))
    common = dict(state=state, H=H, HV=H * draw(st.sampled_from([1, 3])), K=draw(st.sampled_from([16, 32])),
                  decay=draw(st.sampled_from(["strong", "weak", "zero"])), slots=draw(st.sampled_from(["shuffled", "padded"])),
                  qk="unit", act=act, seed=draw(st.integers(0, 1000)))
    if op == "decode":
        return make_cell("gdn", op, **common, V=draw(st.sampled_from([16, 32])), N=draw(st.integers(1, 3)))
    if op == "spec_decode":
        return make_cell("gdn", op, **common, drafts=tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))),
                         accepted=draw(st.sampled_from(["0", "1", "S", "mix"])))
    return make_cell("gdn", op, **common, lens=tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2))),
                     interval=draw(st.sampled_from([1, 2, 64])))


def _launch(op, x, pool, out, **over):
    args = {n: (_t(x[n]) if isinstance(x[n], np.ndarray) else x[n]) for n in x if n not in ("state", "state_dtype")}
    args.update(over)
    kw = dict(scale=args["scale"], use_qk_l2norm=args["use_qk_l2norm"], l2norm_eps=args["l2norm_eps"], out=out)
    kw.update({n: over[n] for n in ("block_v", "num_warps") if n in over})
    if op == "decode":
        return K.decode(*(args[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")), pool, args["state_indices"],
                        **kw)
    if op == "spec_decode":
        return K.spec_decode(*(args[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")), pool,
                             args["spec_state_indices"], args["num_accepted_tokens"], args["cu_seqlens"], **kw)
    return K.recurrent(*(args[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")), pool, args["state_indices"],
                       state_write_interval=args["state_write_interval"], **kw)


def _valid_call(cell):
    x = gdn.make_inputs(cell)
    S, HV, Kd, V = x["state"].shape
    sdt = to_torch(x["state"]).dtype
    pool_buf, pool, pool_owned = _guarded((S, HV, Kd, V), (HV * Kd * V + 8, Kd * V, V, 1), sdt)
    pool.copy_(_t(x["state"]))
    T = x["q"].shape[0]
    out_buf, out, out_owned = _guarded((T, HV, V), (HV * V, V, 1), to_torch(x["q"]).dtype)
    return x, pool_buf, pool, pool_owned, out_buf, out, out_owned


@pytest.mark.parametrize("op", ["decode", "spec_decode", "recurrent"])
@FEW
@given(data=st.data())
def test_valid_calls_pass_the_family_check_and_write_only_their_views(op, data):
    cell = _cell(data.draw, op)
    x, pool_buf, pool, pool_owned, out_buf, out, out_owned = _valid_call(cell)
    pool_before, out_before = pool_buf.clone(), out_buf.clone()
    assert _launch(op, x, pool, out) is out
    verdict = gdn.check(cell, "exact", x, {"o": to_numpy(out), "state": to_numpy(pool.contiguous()).astype(np.float32)})
    assert verdict.status == "pass", verdict.reason
    for buf, before, owned, what in ((pool_buf, pool_before, pool_owned, "pool"), (out_buf, out_before, out_owned, "out")):
        stray = ((buf != before) & ~owned).nonzero().flatten()
        assert stray.numel() == 0, f"{stray.numel()} bytes written around the {what} (first at {stray[:5].tolist()})"


# ---------------------------------------------------------------- bad input

def _nan(name):
    def make(x, pool, out):
        t = _t(x[name]).clone()
        t.view(-1)[0] = float("nan")
        return t
    return name, make


# NaN inputs and scales, slots past the pool, l2norm_eps and the gates: rows of the family's refusal table
# (conformance.families.gdn.REFUSALS), run on every implementation by tests/unit/test_refusals.py
DECODE = {
    "q NaN in a float16 call": _nan("q"),
    "q as a list": ("q", lambda x, p, o: x["q"].astype(np.float32).tolist()),
    "k of another dtype": ("k", lambda x, p, o: _t(x["k"]).to(torch.float64)),
    "A_log of another shape": ("A_log", lambda x, p, o: _t(x["A_log"])[:1]),
    "state_indices repeated": ("state_indices", lambda x, p, o: [0] * len(x["state_indices"])),
    "state_indices int64": ("state_indices", lambda x, p, o: _t(x["state_indices"]).long()),
    "out overlaps the pool": ("out", lambda x, p, o: p[0].reshape(-1)[: o.numel()].view(o.dtype).view(o.shape)),
    "out of another shape": ("out", lambda x, p, o: torch.empty(o.shape[0], o.shape[1], o.shape[2] + 1, dtype=o.dtype)),
    "state a transposed view": ("state", lambda x, p, o: p.transpose(-1, -2)),
    "block_v 48": ("block_v", lambda x, p, o: 48),
    "num_warps 3": ("num_warps", lambda x, p, o: 3),
}

REFERENCE_SAME = ("q NaN in a float16 call", "state_indices repeated")  # the reference reads HV from A_log: a wrong
# A_log is a wrong a there


def _names(exc: BaseException, name: str) -> bool:
    return re.match(rf"{re.escape(name)}\b", str(exc)) is not None


@pytest.mark.parametrize("label", sorted(DECODE))
def test_bad_decode_input_is_refused_by_name_and_nothing_is_written(label):
    cell = make_cell("gdn", "decode", state="bfloat16", H=2, HV=4, K=16, V=16, N=3, decay="weak", slots="padded",
                     qk="unit", act="float16")
    x, pool_buf, pool, _, out_buf, out, _ = _valid_call(cell)
    name, make = DECODE[label]
    value = make(x, pool, out)
    if name == "out":
        out = value
    before = (pool_buf.clone(), out_buf.clone())
    over = {} if name == "out" else {name: value}
    if name == "state":
        with pytest.raises((ValueError, TypeError)) as refused:
            K.decode(*(_t(x[n]) for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")), value, _t(x["state_indices"]),
                     out=out)
    else:
        with pytest.raises((ValueError, TypeError)) as refused:
            _launch("decode", x, pool, out, **over)
    assert _names(refused.value, name), f"{label}: {refused.value!r} does not name {name}"
    assert torch.equal(pool_buf, before[0]) and torch.equal(out_buf, before[1]), "a refused call wrote"
    if label not in REFERENCE_SAME:
        return
    ref = {n: x[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias", "state_indices")}
    ref[name] = value.numpy() if isinstance(value, torch.Tensor) else value
    kw = dict(scale=x["scale"], l2norm_eps=x["l2norm_eps"], state_dtype="bfloat16")
    if name in kw:
        kw[name] = ref.pop(name)
    with pytest.raises(type(refused.value)) as by_reference:
        numpy_ref.decode(*(ref[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")), x["state"].copy(),
                         ref["state_indices"], **kw)
    assert _names(by_reference.value, name), f"{label}: the reference's {by_reference.value!r} does not name {name}"


@pytest.mark.parametrize("op,name,value", [
    ("spec_decode", "cu_seqlens", lambda x: [0] * len(x["cu_seqlens"])),
    ("spec_decode", "spec_state_indices", lambda x: np.full_like(x["spec_state_indices"], 10 ** 6).tolist()),
    ("recurrent", "state_write_interval", lambda x: 0),
    ("recurrent", "g", lambda x: _t(x["g"]).to(torch.bfloat16)),
    ("recurrent", "cu_seqlens", lambda x: [0] * len(x["cu_seqlens"])),
])
def test_bad_spec_decode_and_recurrent_input_is_refused_by_name(op, name, value):
    extra = dict(drafts=(2, 3), accepted="mix") if op == "spec_decode" else dict(lens=(2, 3), interval=2)
    cell = make_cell("gdn", op, state="float16", H=1, HV=2, K=16, decay="weak", slots="padded", qk="unit",
                     act="bfloat16", **extra)
    x, pool_buf, pool, _, out_buf, out, _ = _valid_call(cell)
    before = (pool_buf.clone(), out_buf.clone())
    with pytest.raises((ValueError, TypeError)) as refused:
        _launch(op, x, pool, out, **{name: value(x)})
    assert _names(refused.value, name), f"{refused.value!r} does not name {name}"
    assert torch.equal(pool_buf, before[0]) and torch.equal(out_buf, before[1]), "a refused call wrote"


def test_problem_names_what_the_kernels_cannot_serve():
    assert K.problem(K=128, V=128, state_dtype="bfloat16", act="float16", H=16, HV=32) is None
    assert K.problem(K=300, V=128, state_dtype="float32", act="bfloat16").startswith("q: key head size K=300")
    assert K.problem(K=64, V=512, state_dtype="float32", act="bfloat16").startswith("v: value head size V=512")
    assert K.problem(K=64, V=64, state_dtype="float64", act="bfloat16").startswith("state: dtype float64")
    assert K.problem(K=64, V=64, state_dtype="float32", act="bfloat16", H=3, HV=4).startswith(
        "v: HV=4 value heads is not a multiple")
