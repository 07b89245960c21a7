"""Bad input to the GDN references and the torch baseline raises ValueError/TypeError naming the argument."""
from __future__ import annotations

import numpy as np
import pytest

import reference.gdn.jax_ref as jax_ref
import reference.gdn.numpy_ref as numpy_ref
from conformance.cells import make_cell
from conformance.families import gdn

CELL = make_cell("gdn", "chunked", state="float32", H=2, HV=4, K=16, lens=(5, 7), decay="weak",
                 slots="shuffled", split=None)
IMPLS = {"numpy": numpy_ref, "jax": jax_ref}


def _args():
    x = gdn.make_inputs(CELL)
    return {n: x[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "state_indices")}


def _nan_q(a):
    a["q"] = a["q"].copy()
    a["q"][0, 0, 0] = np.nan


BAD = {
    "k shape": (lambda a: a.update(k=a["k"][:, :, :8]), ValueError, "k"),
    "HV not a multiple of H": (lambda a: a.update(q=np.zeros((12, 3, 16), np.float32),
                                                  k=np.zeros((12, 3, 16), np.float32)), ValueError, "HV"),
    "cu_seqlens not increasing": (lambda a: a.update(cu_seqlens=np.array([0, 12, 12], np.int32)),
                                  ValueError, "cu_seqlens"),
    "cu_seqlens float": (lambda a: a.update(cu_seqlens=a["cu_seqlens"].astype(np.float32)), TypeError, "cu_seqlens"),
    "slot out of range": (lambda a: a.update(state_indices=np.array([0, 99], np.int32)), ValueError, "state_indices"),
    "slot twice": (lambda a: a.update(state_indices=np.array([1, 1], np.int32)), ValueError, "state_indices"),
    "state dtype": (lambda a: a.update(state=a["state"].astype(np.float16)), TypeError, "state"),
    "q integer": (lambda a: a.update(q=a["q"].astype(np.int32)), TypeError, "q"),
    "NaN in q": (_nan_q, ValueError, "q"),
    "g shape": (lambda a: a.update(g=a["g"][:, :2]), ValueError, "g"),
    "zero-length": (lambda a: a.update(q=a["q"][:0], k=a["k"][:0], v=a["v"][:0]), ValueError, "q"),
    "q as a list": (lambda a: a.update(q=a["q"].tolist()), TypeError, "q"),
    "state as a list": (lambda a: a.update(state=a["state"].tolist()), TypeError, "state"),
    "state_indices of floats": (lambda a: a.update(state_indices=[0.0, 1.0]), TypeError, "state_indices"),
    "cu_seqlens ragged": (lambda a: a.update(cu_seqlens=[[0], [5, 12]]), ValueError, "cu_seqlens"),
}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_varlen_input_is_named(impl, case):
    args = _args()
    mutate, error, name = BAD[case]
    mutate(args)
    with pytest.raises(error, match=name):
        IMPLS[impl].chunked(*args.values())


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_chunked_interval_must_be_a_multiple_of_the_chunk(impl):
    with pytest.raises(ValueError, match="state_write_interval"):
        IMPLS[impl].chunked(*_args().values(), state_write_interval=32)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_bad_spec_decode_input_is_named(impl):
    cell = make_cell("gdn", "spec_decode", state="float32", H=2, HV=4, K=16, drafts=(3, 2), accepted="1",
                     decay="weak", slots="shuffled")
    x = gdn.make_inputs(cell)
    names = ("q", "k", "v", "A_log", "a", "b", "dt_bias", "state", "spec_state_indices",
             "num_accepted_tokens", "cu_seqlens")
    args = {n: x[n] for n in names}
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        IMPLS[impl].spec_decode(*{**args, "num_accepted_tokens": np.array([9, 0], np.int32)}.values())
    with pytest.raises(ValueError, match="dt_bias"):
        IMPLS[impl].spec_decode(*{**args, "dt_bias": x["dt_bias"][:3]}.values())


def test_unknown_state_dtype_name_is_named():
    with pytest.raises(ValueError, match="state_dtype"):
        numpy_ref.recurrent(*_args().values(), state_dtype="float8")


@pytest.mark.parametrize("case", ["k shape", "HV not a multiple of H", "cu_seqlens not increasing",
                                  "slot out of range", "state dtype", "NaN in q", "zero-length"])
def test_bad_input_to_torch_eager_is_named(case):
    pytest.importorskip("torch")
    from conformance.torch_arrays import to_torch
    from optimized.torch.gdn_chunked import chunked

    args = _args()
    mutate, error, name = BAD[case]
    mutate(args)
    tensors = [to_torch(a) for a in args.values()]
    with pytest.raises(error, match=name):
        chunked(*tensors)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_bad_decode_gate_heads_are_named(impl):
    cell = make_cell("gdn", "decode", state="float32", H=2, HV=4, K=16, V=8, N=3, decay="weak",
                     slots="shuffled")
    x = gdn.make_inputs(cell)
    args = {n: x[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias", "state", "state_indices")}
    with pytest.raises(ValueError, match="A_log"):
        IMPLS[impl].decode(*{**args, "A_log": x["A_log"][:2], "dt_bias": x["dt_bias"][:2],
                             "a": x["a"][:, :2], "b": x["b"][:, :2]}.values())


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("scale,error", [(float("nan"), ValueError), (float("inf"), ValueError),
                                         (-1.0, ValueError), ("0.25", TypeError), (True, TypeError)])
def test_bad_scale_is_named(impl, scale, error):
    with pytest.raises(error, match="^scale: expected"):
        IMPLS[impl].chunked(*_args().values(), scale=scale)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_index_sequences_given_as_lists_are_converted(impl):
    """Same o from lists as from arrays (the JAX reference returns (o, new state))."""
    a, b = _args(), _args()
    b.update(cu_seqlens=b["cu_seqlens"].tolist(), state_indices=tuple(b["state_indices"].tolist()))
    expected, got = (IMPLS[impl].chunked(*x.values()) for x in (a, b))
    if impl == "jax":
        expected, got = expected[0], got[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
