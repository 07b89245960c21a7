"""Cost models: bytes moved and FLOPs of one call of a family op at a shape, written once.

A shape is a dict of the op's sizes (the keys each function reads). Bytes count what the op must
read and write at least once (the state pool read and written back, activations in and out);
FLOPs count multiply-adds as two.
"""
from __future__ import annotations

from dataclasses import dataclass

STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACT_BYTES = 2          # bf16 activations (q, k, v, a, b, outputs)
CHUNK = 64             # GDN chunked prefill chunk length


@dataclass(frozen=True)
class Cost:
    bytes: int
    flops: int


def gdn_state_bytes(shape: dict) -> int:
    """Bytes of the state pool ``[N, HV, K, V]`` of ``shape["state_dtype"]``."""
    return shape["N"] * shape["HV"] * shape["K"] * shape["V"] * STATE_BYTES[shape["state_dtype"]]


def gdn_decode(shape: dict) -> Cost:
    """One decode step of N sequences: the state read and written once; q, k ``[N,H,K]``, v and o
    ``[N,HV,V]``, a and b ``[N,HV]`` in bf16. FLOPs per (sequence, value head): k^T S (2KV),
    decay and rank-1 update (3KV), q^T S (2KV)."""
    N, H, HV, K, V = (shape[k] for k in ("N", "H", "HV", "K", "V"))
    io = ACT_BYTES * N * (2 * H * K + 2 * HV * V + 2 * HV)
    return Cost(bytes=2 * gdn_state_bytes(shape) + io, flops=7 * N * HV * K * V)


def gdn_chunked(shape: dict) -> Cost:
    """Chunked prefill of sequences of lengths ``shape["lens"]`` (64-token chunks): q, k, v, o in
    bf16, g and beta fp32, each sequence's state read and written once. FLOPs of the GEMMs per
    chunk and value head: kk^T, qk^T, T X (2C^2K each), T Y and P V (2C^2V each), W S, Q S and
    K^T V (2CKV each), over full chunks."""
    H, HV, K, V = (shape[k] for k in ("H", "HV", "K", "V"))
    lens = shape["lens"]
    T = sum(lens)
    io = ACT_BYTES * T * (2 * H * K + 2 * HV * V) + 4 * T * HV * 2
    state = 2 * len(lens) * HV * K * V * STATE_BYTES[shape["state_dtype"]]
    chunks = sum(-(-n // CHUNK) for n in lens)
    per_chunk = 3 * 2 * CHUNK * CHUNK * K + 2 * 2 * CHUNK * CHUNK * V + 3 * 2 * CHUNK * K * V
    return Cost(bytes=io + state, flops=chunks * HV * per_chunk)


def turboquant_decode(shape: dict) -> Cost:
    """Decode attention of B queries over L cached tokens each: the compressed cache read once
    per kv head (``slot_size`` bytes per token and kv head), the bf16 query and output. FLOPs:
    Q K^T and P V, 2 L D per query head each."""
    from reference.turboquant.presets import preset

    B, Hk, G, D, L = (shape[k] for k in ("B", "Hk", "G", "D", "L"))
    cache = B * L * Hk * preset(shape["preset"]).slot_size(D)
    return Cost(bytes=cache + 2 * ACT_BYTES * B * Hk * G * D, flops=4 * B * Hk * G * L * D)


def attention_decode_bf16(shape: dict) -> Cost:
    """The same decode on an uncompressed bf16 cache (what SDPA reads): K and V, 2 D bytes per
    token and kv head each."""
    B, Hk, G, D, L = (shape[k] for k in ("B", "Hk", "G", "D", "L"))
    return Cost(bytes=2 * ACT_BYTES * B * L * Hk * D + 2 * ACT_BYTES * B * Hk * G * D,
                flops=4 * B * Hk * G * L * D)
