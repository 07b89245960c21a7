"""Bad arguments to the C++ GDN kernels raise TypeError / ValueError naming the argument, before
any kernel code runs (the state pool is left untouched)."""
from __future__ import annotations

import numpy as np
import pytest

import optimized.cpu as cpu

BUILT, WHY = cpu.extension_status()
pytestmark = pytest.mark.skipif(not BUILT, reason=WHY)

N, H, HV, K, V = 3, 2, 4, 64, 64


def _decode_args():
    rng = np.random.default_rng(0)
    return dict(q=rng.normal(size=(N, H, K)).astype(np.float32), k=rng.normal(size=(N, H, K)).astype(np.float32),
                v=rng.normal(size=(N, HV, V)).astype(np.float32), A_log=np.zeros(HV, np.float32),
                a=np.zeros((N, HV), np.float32), b=np.zeros((N, HV), np.float32),
                dt_bias=np.zeros(HV, np.float32), state=np.ones((N + 1, HV, K, V), np.float32),
                state_indices=np.arange(N, dtype=np.int32))


def _chunk_args():
    rng = np.random.default_rng(1)
    T = 10
    return dict(q=rng.normal(size=(T, H, K)).astype(np.float32), k=rng.normal(size=(T, H, K)).astype(np.float32),
                v=rng.normal(size=(T, HV, V)).astype(np.float32), g=np.full((T, HV), -0.1, np.float32),
                beta=np.full((T, HV), 0.5, np.float32), cu_seqlens=np.array([0, 4, 10], np.int32),
                state=np.ones((3, HV, K, V), np.float32), state_indices=np.array([2, 0], np.int32))


def _spec_args():
    rng = np.random.default_rng(2)
    T = 5
    return dict(q=rng.normal(size=(T, H, K)).astype(np.float32), k=rng.normal(size=(T, H, K)).astype(np.float32),
                v=rng.normal(size=(T, HV, V)).astype(np.float32), A_log=np.zeros(HV, np.float32),
                a=np.zeros((T, HV), np.float32), b=np.zeros((T, HV), np.float32),
                dt_bias=np.zeros(HV, np.float32), state=np.ones((8, HV, K, V), np.float32),
                spec_state_indices=np.array([[0, 1, 2], [3, 4, 5]], np.int32),
                num_accepted_tokens=np.array([1, 2], np.int32), cu_seqlens=np.array([0, 2, 5], np.int32))


OPS = {"decode": (cpu.gdn_decode, _decode_args), "chunk": (cpu.gdn_chunk_prefill, _chunk_args),
       "spec": (cpu.gdn_spec_decode, _spec_args)}


def _raises(op, exc, match, **changes):
    fn, make = OPS[op]
    args = make()
    args.update(changes)
    before = args["state"].copy()
    with pytest.raises(exc, match=match):
        fn(**args, isa="scalar")
    np.testing.assert_array_equal(args["state"], before)


def test_valid_arguments_run():
    for fn, make in OPS.values():
        fn(**make(), isa="scalar")


@pytest.mark.parametrize("op", ["decode", "chunk", "spec"])
def test_dtype_errors(op):
    _raises(op, TypeError, r"^q: expected float32", q=np.zeros((N if op == "decode" else 10 if op == "chunk" else 5,
                                                                H, K), np.float64))
    _raises(op, TypeError, r"int32", **{"state_indices" if op != "spec" else "spec_state_indices":
                                        (np.arange(N) if op == "decode" else np.array([2, 0]) if op == "chunk"
                                         else np.array([[0, 1, 2], [3, 4, 5]])).astype(np.int64)})
    _raises(op, TypeError, r"^state: expected float32", state=np.ones((8, HV, K, V), np.int16))


@pytest.mark.parametrize("op", ["decode", "chunk", "spec"])
def test_shape_errors(op):
    T = {"decode": N, "chunk": 10, "spec": 5}[op]
    _raises(op, ValueError, r"^k: expected shape \[T, H, K\]", k=np.zeros((T, H, K + 1), np.float32))
    _raises(op, ValueError, r"^v: value heads HV = 3 must be a multiple", v=np.zeros((T, 3, V), np.float32))
    _raises(op, ValueError, r"^state: expected shape \[S, HV, K, V\]", state=np.ones((4, HV, K, V + 1), np.float32))
    _raises(op, ValueError, r"^q: zero-length array", q=np.zeros((0, H, K), np.float32))


def test_stride_errors():
    q = np.zeros((N, K, H), np.float32).transpose(0, 2, 1)
    _raises("decode", ValueError, r"^q: expected a C-contiguous array", q=q)
    state = np.ones((N + 1, HV, V, K), np.float32).transpose(0, 1, 3, 2)
    _raises("decode", ValueError, r"^state: each slot must be contiguous", state=state)
    overlapping = np.lib.stride_tricks.as_strided(np.ones(HV * K * V * 2, np.float32), (N + 1, HV, K, V),
                                                  (4 * K * V, 4 * K * V, 4 * V, 4))
    _raises("decode", ValueError, r"^state: each slot must be contiguous", state=overlapping)
    state = np.ones((N + 1, HV, K, V), np.float32)
    _raises("decode", ValueError, r"^state: overlaps q in memory", state=state,
            q=state.reshape(-1)[:N * H * K].reshape(N, H, K))


def test_index_errors():
    _raises("decode", ValueError, r"^state_indices: entry 1 is 9, expected -1 or a slot in \[0, 4\)",
            state_indices=np.array([0, 9, 1], np.int32))
    _raises("decode", ValueError, r"^state_indices: entry 0 is -2", state_indices=np.array([-2, 0, 1], np.int32))
    _raises("decode", ValueError, r"^state_indices: slot 1 appears twice", state_indices=np.array([1, 1, 0], np.int32))
    _raises("chunk", ValueError, r"^cu_seqlens: must be strictly increasing", cu_seqlens=np.array([0, 4, 4], np.int32))
    _raises("chunk", ValueError, r"^cu_seqlens: must end at the token count 10", cu_seqlens=np.array([0, 4, 9], np.int32))
    _raises("chunk", ValueError, r"^cu_seqlens: must start at 0", cu_seqlens=np.array([1, 4, 10], np.int32))
    _raises("spec", ValueError, r"^num_accepted_tokens: entry 0 is 4", num_accepted_tokens=np.array([4, 0], np.int32))
    _raises("spec", ValueError, r"^spec_state_indices: sequence 1 has a padding slot",
            spec_state_indices=np.array([[0, 1, 2], [3, -1, 5]], np.int32), num_accepted_tokens=np.array([1, 1], np.int32))
    _raises("spec", ValueError, r"^cu_seqlens: sequence 1 has 4 tokens",
            cu_seqlens=np.array([0, 1, 5], np.int32))


def test_value_errors():
    q = _decode_args()["q"]
    q[1, 0, 3] = np.nan
    _raises("decode", ValueError, r"^q: 1 NaN or Inf values", q=q)
    _raises("chunk", TypeError, r"^g: expected float32", g=np.zeros((10, HV), np.float16))
    _raises("chunk", ValueError, r"^q/v: chunk prefill supports head sizes",
            q=np.zeros((10, H, 48), np.float32), k=np.zeros((10, H, 48), np.float32),
            state=np.ones((3, HV, 48, V), np.float32))
    _raises("decode", ValueError, r"^scale: expected a positive finite number", scale=-1.0)


def test_option_errors():
    args = _decode_args()
    with pytest.raises(ValueError, match=r"^isa: expected 'auto', 'amx', 'avx512' or 'scalar'"):
        cpu.gdn_decode(**args, isa="sse")
    unavailable = [isa for isa, (ok, _) in cpu.isa_status().items() if not ok]
    for isa in unavailable:
        with pytest.raises(ValueError, match=rf"^isa: '{isa}' cannot run here"):
            cpu.gdn_decode(**args, isa=isa)
    with pytest.raises(ValueError, match=r"^num_threads: expected an integer in \[1, 1024\]"):
        cpu.gdn_decode(**args, isa="scalar", num_threads=0)
    with pytest.raises(ValueError, match=r"^out_dtype: expected one of"):
        cpu.gdn_decode(**args, isa="scalar", out_dtype="int8")
    read_only = args.pop("state")
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"^state: the NumPy array is read-only"):
        cpu.gdn_decode(**args, state=read_only, isa="scalar")


def test_jax_state_is_refused():
    jnp = pytest.importorskip("jax.numpy")
    args = _decode_args()
    args["state"] = jnp.asarray(args["state"])
    with pytest.raises(TypeError, match=r"^state: JAX arrays are immutable"):
        cpu.gdn_decode(**args, isa="scalar")


@pytest.mark.parametrize("name,value,exc,match", [
    ("scale", float("nan"), ValueError, r"^scale: expected a positive finite number"),
    ("scale", float("inf"), ValueError, r"^scale: expected a positive finite number"),
    ("scale", "0.1", TypeError, r"^scale: expected a real number"),
    ("l2norm_eps", float("nan"), ValueError, r"^l2norm_eps: expected a finite number"),
    ("num_threads", 1025, ValueError, r"^num_threads: expected an integer in \[1, 1024\]"),
    ("num_threads", 2.0, ValueError, r"^num_threads: expected an integer"),
    ("num_threads", 2 ** 40, ValueError, r"^num_threads: expected an integer"),
])
def test_non_finite_scalars_and_thread_counts_name_themselves(name, value, exc, match):
    args = _decode_args()
    before = args["state"].copy()
    with pytest.raises(exc, match=match):
        cpu.gdn_decode(**args, isa="scalar", **{name: value})
    np.testing.assert_array_equal(args["state"], before)


def test_index_lists_are_converted_and_data_lists_refused():
    args = _decode_args()
    expected = cpu.gdn_decode(**{**args, "state": args["state"].copy()}, isa="scalar")
    got = cpu.gdn_decode(**{**args, "state_indices": list(range(N))}, isa="scalar")
    np.testing.assert_array_equal(got, expected)
    spec = _spec_args()
    cpu.gdn_spec_decode(**{**spec, "cu_seqlens": [0, 2, 5], "num_accepted_tokens": (1, 2),
                           "spec_state_indices": [[0, 1, 2], [3, 4, 5]]}, isa="scalar")
    _raises("decode", TypeError, r"^state_indices: expected integers", state_indices=[0.0, 1.0, 2.0])
    _raises("decode", TypeError, r"^q: expected an array, got list", q=_decode_args()["q"].tolist())
    _raises("decode", TypeError, r"^A_log: expected an array, got list", A_log=[0.0] * HV)
    _raises("decode", TypeError, r"^state: expected an array, got list", state=[[0.0]])


def _out_case(out, exc, match):
    args = _decode_args()
    before = args["state"].copy()
    with pytest.raises(exc, match=match):
        cpu.gdn_decode(**args, isa="scalar", out=out)
    np.testing.assert_array_equal(args["state"], before)


def test_outputs_are_checked_like_inputs():
    torch = pytest.importorskip("torch")
    _out_case(np.zeros((N, HV, V + 1), np.float32), ValueError, r"^out: expected shape \[T, HV, V\]")
    _out_case(np.zeros((N, HV, V), np.float64), TypeError, r"^out: expected float32")
    _out_case(np.zeros((N, HV, 2 * V), np.float32)[:, :, ::2], ValueError, r"^out: expected a C-contiguous")
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(HV * V, np.float32), (N, HV, V), (0, 4 * V, 4))
    _out_case(overlapping, ValueError, r"^out: expected a C-contiguous")
    read_only = np.zeros((N, HV, V), np.float32)
    read_only.flags.writeable = False
    _out_case(read_only, ValueError, r"^out: the NumPy array is read-only")
    _out_case(torch.zeros(N, HV, V), TypeError, r"^out: expected a numpy array like q")
    _out_case(np.zeros((N, HV, V), np.float32).tolist(), TypeError, r"^out: expected an array")
    args = _decode_args()
    with pytest.raises(ValueError, match=r"^out: overlaps v in memory"):
        cpu.gdn_decode(**args, isa="scalar", out=args["v"])
    with pytest.raises(ValueError, match=r"^out: overlaps state in memory"):
        cpu.gdn_decode(**args, isa="scalar", out=args["state"][1, :N].reshape(-1)[:N * HV * V].reshape(N, HV, V))
    with pytest.raises(ValueError, match=r"^out: dtype float32 differs from out_dtype"):
        cpu.gdn_decode(**_decode_args(), isa="scalar", out=np.zeros((N, HV, V), np.float32), out_dtype="float16")


def test_output_written_in_place_within_its_view():
    """``out`` a view into a larger buffer: the result lands in the view, the rest keeps its bytes."""
    args = _decode_args()
    expected = cpu.gdn_decode(**{**args, "state": args["state"].copy()}, isa="scalar")
    buf = np.full(N * HV * V + 64, 7.0, np.float32)
    out = buf[32:32 + N * HV * V].reshape(N, HV, V)
    assert cpu.gdn_decode(**args, isa="scalar", out=out) is out
    np.testing.assert_array_equal(out, expected)
    assert (buf[:32] == 7.0).all() and (buf[32 + N * HV * V:] == 7.0).all()
