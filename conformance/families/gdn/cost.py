"""Cost models of the GDN ops (``conformance.cost.Cost``). A shape is a dict of sizes: H, HV, K,
V, ``state_dtype``, and N (decode batch) or ``lens`` (prefill sequence lengths). Activations
(q, k, v, a, b, outputs) are bf16."""
from __future__ import annotations

from conformance.cost import Cost
from conformance.families.gdn.matrix import CHUNK

STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACT_BYTES = 2


def state_bytes(shape: dict) -> int:
    """Bytes of the state pool ``[N, HV, K, V]`` of ``shape["state_dtype"]``."""
    return shape["N"] * shape["HV"] * shape["K"] * shape["V"] * STATE_BYTES[shape["state_dtype"]]


def decode(shape: dict) -> Cost:
    """One decode step of N sequences: the state read and written once; q, k ``[N,H,K]``, v and o
    ``[N,HV,V]``, a and b ``[N,HV]``. FLOPs per (sequence, value head): k^T S (2KV), decay and
    rank-1 update (3KV), q^T S (2KV)."""
    N, H, HV, K, V = (shape[k] for k in ("N", "H", "HV", "K", "V"))
    io = ACT_BYTES * N * (2 * H * K + 2 * HV * V + 2 * HV)
    return Cost(bytes=2 * state_bytes(shape) + io, flops=7 * N * HV * K * V)


def spec_decode(shape: dict) -> Cost:
    """Speculative verify of N sequences of T draft tokens each: the state read once (the accepted draft's slot)
    and stored T times (one slot per draft token); q, k, v, a, b and o of N T tokens; T decode updates per
    (sequence, value head)."""
    N, T, H, HV, K, V = (shape[k] for k in ("N", "T", "H", "HV", "K", "V"))
    io = ACT_BYTES * N * T * (2 * H * K + 2 * HV * V + 2 * HV)
    return Cost(bytes=(1 + T) * state_bytes(shape) + io, flops=7 * N * T * HV * K * V)


def chunked(shape: dict) -> Cost:
    """Chunked prefill of sequences of lengths ``shape["lens"]`` (64-token chunks): q, k, v, o;
    g and beta fp32; each sequence's state read and written once. FLOPs of the GEMMs per chunk and
    value head: kk^T, qk^T, T X (2C^2K each), T Y and P V (2C^2V each), W S, Q S and K^T V (2CKV
    each), over full chunks."""
    H, HV, K, V = (shape[k] for k in ("H", "HV", "K", "V"))
    lens = shape["lens"]
    T = sum(lens)
    io = ACT_BYTES * T * (2 * H * K + 2 * HV * V) + 4 * T * HV * 2
    state = 2 * len(lens) * HV * K * V * STATE_BYTES[shape["state_dtype"]]
    chunks = sum(-(-n // CHUNK) for n in lens)
    per_chunk = 3 * 2 * CHUNK * CHUNK * K + 2 * 2 * CHUNK * CHUNK * V + 3 * 2 * CHUNK * K * V
    return Cost(bytes=io + state, flops=chunks * HV * per_chunk)
