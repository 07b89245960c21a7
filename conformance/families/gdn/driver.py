"""GDN driver: run a cell's op through an implementation with the reference's function names.

``impl`` has ``gating``, ``recurrent``, ``chunked``, ``decode`` and ``spec_decode`` with the
signatures of ``reference.gdn.numpy_ref``, in one of two forms: NumPy (mutates the state pool in
place, returns ``o``) or JAX (returns ``(o, new_pool)``); a tuple result means the JAX form.

Varlen ops run as one call, or one call per piece between ``cuts`` (a chunked split, a recurrent
chain's calls); decode as ``steps`` calls; each call's pool is the one the previous call left.

Outputs: gating {"g", "beta"} float32 [T,HV]; the others {"o": [T,HV,V] in the dtype the
implementation returned (the check accepts float32 or the cell's activation dtype), "state": the
whole pool as float32}. Rows of ``o`` that belong to padding sequences are unspecified, but NaN or
Inf there fails the check.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell
from conformance.families.gdn.matrix import OPS
from reference.gdn import numpy_ref as ref

class DecodeAsRecurrent:
    """For an implementation in numpy_ref's signatures that has ``recurrent``: ``decode`` as a
    recurrent call of one-token sequences, its gates in float64."""

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, **kw):
        g, beta = ref.gating(A_log, a, b, dt_bias, compute_dtype="float64")
        cu = np.arange(len(state_indices) + 1, dtype=np.int32)
        return self.recurrent(q, k, v, g, beta, cu, state, state_indices, **kw)


def as_f32(x) -> np.ndarray:
    """``x`` (NumPy, JAX or ml_dtypes array) as a float32 NumPy array."""
    return np.asarray(x).astype(np.float32)


def _invoke(fn, args: tuple, kwargs: dict, state):
    """Call an op in NumPy form (mutates the pool, returns o) or JAX form (returns (o, pool))."""
    result = fn(*args, **kwargs)
    if isinstance(result, tuple):
        return result
    return result, state


def cuts(inputs: dict) -> tuple[int, ...]:
    """Token offsets, from each sequence's start, where the driver begins a new call of a varlen op:
    none, a chunked op's two-call ``split``, or a recurrent chain's ``calls`` - 1 equal steps
    (ceil(longest / calls) tokens a call)."""
    split, calls = inputs.get("split"), inputs.get("calls", 1)
    if split is not None:
        return (split,)
    if calls == 1:
        return ()
    longest = int(np.max(np.diff(inputs["cu_seqlens"])))
    per = -(-longest // calls)
    return tuple(range(per, longest, per))


def _varlen_calls(fn, inputs: dict, kwargs: dict):
    """One call, or one call per piece between the ``cuts`` of every sequence (a sequence with no
    tokens in a piece is left out of that call), the pool carried from call to call."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    cu, idx, state, offsets = inputs["cu_seqlens"], inputs["state_indices"], inputs["state"], cuts(inputs)
    if not offsets:
        return _invoke(fn, (q, k, v, g, beta, cu, state, idx), kwargs, state)
    o = None
    starts, ends = cu[:-1].astype(np.int64), cu[1:].astype(np.int64)
    bounds = (0,) + offsets
    parts = [(np.minimum(starts + lo, ends), ends if hi is None else np.minimum(starts + hi, ends),
              (ends - starts > lo) if lo else np.ones(len(starts), bool))
             for lo, hi in zip(bounds, bounds[1:] + (None,))]
    for lo, hi, keep in parts:
        tokens = np.concatenate([np.arange(a, b) for a, b, kept in zip(lo, hi, keep) if kept])
        sub_cu = np.concatenate([[0], np.cumsum((hi - lo)[keep])]).astype(np.int32)
        part_o, state = _invoke(fn, (q[tokens], k[tokens], v[tokens], g[tokens], beta[tokens], sub_cu,
                                     state, idx[keep]), kwargs, state)
        part_o = np.asarray(part_o)
        if o is None:
            o = np.zeros((q.shape[0],) + tuple(v.shape[1:]), part_o.dtype)
        o[tokens] = part_o
    return o, state


def _decode_chain(fn, inputs: dict, kwargs: dict):
    """``inputs['steps']`` decode calls (rows s*N .. s*N+N-1 of the token inputs are call s), the pool
    of each call the one the previous call left; o of all calls, in call order."""
    idx, state, steps = inputs["state_indices"], inputs["state"], inputs.get("steps", 1)
    N, outs = len(idx), []
    for s in range(steps):
        rows = slice(s * N, (s + 1) * N)
        args = tuple(inputs[n][rows] for n in ("q", "k", "v")) + (inputs["A_log"],) + tuple(
            inputs[n][rows] for n in ("a", "b")) + (inputs["dt_bias"],)
        o, state = _invoke(fn, args + (state, idx), kwargs, state)
        outs.append(np.asarray(o))
    return (outs[0] if steps == 1 else np.concatenate(outs)), state


def run_with(impl, cell: Cell, inputs: dict) -> dict:
    """Run the cell's op through ``impl`` (a module/object with the reference's function names,
    NumPy in-place or JAX functional semantics); returns the outputs dict."""
    if cell.op == "gating":
        g, beta = impl.gating(inputs["A_log"], inputs["a"], inputs["b"], inputs["dt_bias"])
        return {"g": as_f32(g), "beta": as_f32(beta)}
    opts = {n: inputs[n] for n in ("scale", "use_qk_l2norm", "l2norm_eps", "state_dtype")}
    state = inputs["state"]
    if cell.op == "recurrent":
        o, state = _varlen_calls(impl.recurrent, inputs,
                                 {**opts, "state_write_interval": inputs["state_write_interval"]})
    elif cell.op == "chunked":
        o, state = _varlen_calls(impl.chunked, inputs, {**opts, "chunk_size": inputs["chunk_size"]})
    elif cell.op == "decode":
        o, state = _decode_chain(impl.decode, inputs, opts)
    elif cell.op == "spec_decode":
        args = tuple(inputs[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias"))
        o, state = _invoke(impl.spec_decode, args + (state, inputs["spec_state_indices"],
                                                     inputs["num_accepted_tokens"], inputs["cu_seqlens"]),
                           opts, state)
    else:
        raise ValueError(f"cell.op: expected one of {OPS}, got {cell.op!r}")
    return {"o": np.asarray(o), "state": as_f32(state)}
