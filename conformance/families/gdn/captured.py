"""GDN inputs from a file (``conformance.inputs.captured``): an op's arguments, keyed by the reference's names.

Activations q, k [T,H,K], v [T,HV,V] and beta [T,HV] (recurrent, chunked) or a, b [T,HV] and dt_bias
[HV] (decode, spec_decode) are of one activation dtype (bfloat16, float16 or float32); g [T,HV]
float32 (the log decay); A_log [HV] float32 (or bfloat16, read exactly as float32); state [S,HV,K,V]
in a state dtype (float32, bfloat16, float16); index tables int32 or int64:

    recurrent, chunked: q, k, v, g, beta, cu_seqlens [N+1], state, state_indices [N]
                        (recurrent: the string state_write_interval, default 1; chunked: chunk 64, one call)
    decode:             q, k, v, A_log, a, b, dt_bias, state, state_indices [N] (T = N)
    spec_decode:        q, k, v, A_log, a, b, dt_bias, state, spec_state_indices [N,S],
                        num_accepted_tokens [N], cu_seqlens [N+1]

A slot index -1 is a padding sequence. The options are the matrix's: scale 1/sqrt(K), q/k l2 norm
on, epsilon 1e-6. Shapes and index values are checked by ``reference.gdn.arguments``, in the order that
bounds what is read: ``check_headers`` takes the members' shapes and dtypes from the file's headers (each
against the others: ``SHAPES``), ``check_tables`` the index tables (read first, small) against the other
members' shapes (cu_seqlens ends at T), and ``derive`` the rest once everything is read.

The cell's params, as the matrix's cells of the op: state, H, HV, K, V (decode; the others only
when V != K), then N (decode: rows), lens (recurrent, chunked: every sequence's tokens) or drafts
(spec_decode), slots ("padded" when a sequence is padding, else "shuffled"), interval (recurrent) or
split (chunked: none), act.
"""
from __future__ import annotations

import numpy as np

from conformance.families.gdn.matrix import CHUNK
from conformance.inputs.checks import InputsError, check_keys, check_shapes, dtype_in, index_dtype, index_table
from conformance.numerics import ACTIVATIONS
from reference.gdn import arguments
from reference.gdn.arguments import POOL_DTYPES

_VARLEN = ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "state_indices")
_GATED = ("q", "k", "v", "A_log", "a", "b", "dt_bias", "state")
KEYS = {"recurrent": _VARLEN, "chunked": _VARLEN, "decode": _GATED + ("state_indices",),
        "spec_decode": _GATED + ("spec_state_indices", "num_accepted_tokens", "cu_seqlens")}
OPS = tuple(KEYS)
STRINGS = {"recurrent": ("state_write_interval",)}
TABLES = ("cu_seqlens", "state_indices", "spec_state_indices", "num_accepted_tokens")
OPTIONS = {"scale": None, "use_qk_l2norm": True, "l2norm_eps": 1e-6}
# every member's shape in the dimensions of ``reference.gdn.arguments`` (decode: one token a sequence, T = N)
SHAPES = {"q": ("T", "H", "K"), "k": ("T", "H", "K"), "v": ("T", "HV", "V"), "g": ("T", "HV"),
          "beta": ("T", "HV"), "A_log": ("HV",), "a": ("T", "HV"), "b": ("T", "HV"), "dt_bias": ("HV",),
          "cu_seqlens": ("N+1",), "state": ("S", "HV", "K", "V"), "state_indices": ("N",),
          "spec_state_indices": ("N", "C"), "num_accepted_tokens": ("N",)}


def _shapes(op: str) -> dict[str, tuple[str, ...]]:
    """``SHAPES`` of ``op``'s members."""
    shapes = {**SHAPES, "state_indices": ("T",)} if op == "decode" else SHAPES
    return {name: shapes[name] for name in KEYS[op]}


def _header_dtypes(op: str, members: dict) -> str:
    """The activation dtype, every member's dtype checked (members: anything with a dtype)."""
    act = dtype_in("q", members["q"], ACTIVATIONS)
    same = ("k", "v", "beta") if op in ("recurrent", "chunked") else ("k", "v", "a", "b")
    for name in same:
        dtype_in(name, members[name], (act,), " (the dtype of q)")
    if "dt_bias" in members:   # checkpoints keep it in float32 beside 16-bit activations; kernels upcast it
        dtype_in("dt_bias", members["dt_bias"], tuple(dict.fromkeys((act, "float32"))), " (the dtype of q, or float32)")
    dtype_in("state", members["state"], POOL_DTYPES)
    if "g" in members:
        dtype_in("g", members["g"], ("float32",))
    if "A_log" in members:
        dtype_in("A_log", members["A_log"], ("float32", "bfloat16"))
    for name in TABLES:
        if name in members:
            index_dtype(name, members[name])
    return act


def check_headers(op: str, members: dict) -> None:
    """InputsError/ValueError/TypeError naming the member unless the shapes and dtypes of ``op``'s members
    (anything with a shape and a dtype: a file's headers, no data read) agree with each other."""
    _header_dtypes(op, members)
    check_shapes(members, _shapes(op))
    arguments.qkv_shapes(members["q"], members["k"], members["v"])


def check_tables(op: str, members: dict, tables: dict) -> None:
    """ValueError naming the table unless the index tables' values (``tables``, read) agree with the other
    members' shapes (``members``, as ``check_headers`` passed them): cu_seqlens ends at T, slots lie in the pool."""
    T, S = members["q"].shape[0], members["state"].shape[0]
    if op == "spec_decode":
        arguments.spec_tables(tables["cu_seqlens"], tables["spec_state_indices"], tables["num_accepted_tokens"], T, S)
        return
    N = T if op == "decode" else arguments.cu_seqlens(tables["cu_seqlens"], T).size - 1
    arguments.slot_indices("state_indices", tables["state_indices"], (N,), S)


def _dtypes(op: str, arrays: dict) -> dict:
    """The arrays with their dtypes checked, A_log as float32 and index tables as int32."""
    _header_dtypes(op, arrays)
    out = dict(arrays)
    if "A_log" in arrays:
        out["A_log"] = arrays["A_log"].astype(np.float32)
    out.update({name: index_table(name, arrays[name], np.int32) for name in TABLES if name in arrays})
    return out


def _interval(strings: dict) -> int:
    text = strings.get("state_write_interval", "1")
    try:
        return arguments.interval(int(text))
    except ValueError:
        raise InputsError(f"state_write_interval: {text!r}; expected a whole number >= 1") from None


def keys(op: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The arrays ``op``'s file must hold, those it may hold, and the strings it may hold."""
    return KEYS[op], (), STRINGS.get(op, ())


def derive(op: str, arrays: dict, strings: dict) -> tuple[dict, dict]:
    """(cell params, inputs) of a file of ``op``'s arguments; InputsError/ValueError/TypeError naming the key."""
    if op not in OPS:
        raise InputsError(f"op: gdn/{op} does not take a file; expected one of {', '.join(OPS)}")
    check_keys(arrays, strings, *keys(op))
    check_headers(op, arrays)
    x = _dtypes(op, arrays)
    state = x["state"].dtype.name
    act = x["q"].dtype.name
    inputs = {**x, **OPTIONS, "state_dtype": state}
    scale, eps = OPTIONS["scale"], OPTIONS["l2norm_eps"]
    if op in ("recurrent", "chunked"):
        dims, cu, slots = arguments.varlen(*(x[n] for n in _VARLEN), state, scale, eps)
        arguments.decays(x["g"])
        shape = {"lens": tuple(int(n) for n in np.diff(cu))}
        if op == "recurrent":
            inputs["state_write_interval"] = _interval(strings)
            last = {"interval": inputs["state_write_interval"]}
        else:
            inputs.update(chunk_size=CHUNK, split=None)
            last = {"split": None}
    elif op == "decode":
        dims, slots = arguments.decode(*(x[n] for n in KEYS[op]), state, scale, eps)
        shape, last = {"N": dims.N}, {}
    else:
        dims, cu, _, _, slots = arguments.spec_decode(*(x[n] for n in KEYS[op]), state, scale, eps)
        shape, last = {"drafts": tuple(int(n) for n in np.diff(cu))}, {}
    if not np.any(slots >= 0):
        raise InputsError(f"{'spec_state_indices' if op == 'spec_decode' else 'state_indices'}: every sequence "
                          "is padding (-1); expected at least one real sequence")
    V = {"V": dims.V} if op == "decode" or dims.V != dims.K else {}
    params = dict(state=state, H=dims.H, HV=dims.HV, K=dims.K, **V, **shape,
                  slots="padded" if np.any(slots < 0) else "shuffled", **last, act=act)
    return params, inputs
