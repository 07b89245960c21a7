"""GDN inputs from a file (``conformance.captured``): the decode op's arguments, keyed by the
reference's names.

decode: q [N,H,K], k [N,H,K], v [N,HV,V], a [N,HV], b [N,HV], dt_bias [HV], all of one activation
dtype (bfloat16, float16 or float32); A_log [HV] float32 (or bfloat16, read exactly as float32);
state [S,HV,K,V] in a state dtype (float32, bfloat16, float16); state_indices [N] int32 or int64
(-1: a padding row). The options are the matrix's: scale 1/sqrt(K), q/k l2 norm on, epsilon 1e-6.
Shapes and values are checked by ``reference.gdn.arguments.decode``.

The cell's params: state, H, HV, K, V, N (rows), slots ("padded" when a row is -1, else
"shuffled"), act, as the matrix's decode cells.
"""
from __future__ import annotations

import numpy as np

from conformance.captured import InputsError, check_keys, dtype_in, int32_table
from conformance.numerics import ACTIVATIONS
from reference.gdn import arguments
from reference.gdn.arguments import STATE_DTYPES

OPS = ("decode",)
DECODE_KEYS = ("q", "k", "v", "A_log", "a", "b", "dt_bias", "state", "state_indices")
OPTIONS = {"scale": None, "use_qk_l2norm": True, "l2norm_eps": 1e-6}


def derive(op: str, arrays: dict, strings: dict) -> tuple[dict, dict]:
    """(cell params, inputs) of a decode file; InputsError/ValueError/TypeError naming the key."""
    if op not in OPS:
        raise InputsError(f"op: gdn/{op} does not take a file; expected one of {', '.join(OPS)}")
    check_keys(arrays, strings, DECODE_KEYS)
    act = dtype_in("q", arrays["q"], ACTIVATIONS)
    for name in ("k", "v", "a", "b", "dt_bias"):
        dtype_in(name, arrays[name], (act,), " (the dtype of q)")
    dtype_in("A_log", arrays["A_log"], ("float32", "bfloat16"))
    state = dtype_in("state", arrays["state"], STATE_DTYPES)
    inputs = {**arrays, "A_log": arrays["A_log"].astype(np.float32),
              "state_indices": int32_table("state_indices", arrays["state_indices"]),
              **OPTIONS, "state_dtype": state}
    dims, idx = arguments.decode(*(inputs[n] for n in DECODE_KEYS), state, OPTIONS["scale"], OPTIONS["l2norm_eps"])
    if not np.any(idx >= 0):
        raise InputsError("state_indices: every row is padding (-1); expected at least one slot index >= 0")
    params = dict(state=state, H=dims.H, HV=dims.HV, K=dims.K, V=dims.V, N=dims.N,
                  slots="padded" if np.any(idx < 0) else "shuffled", act=act)
    return params, inputs
