"""Cost models of TurboQuant decode attention (``conformance.cost.Cost``). A shape is a dict of
B (queries), Hk (kv heads), G (query heads per kv head), D, L (cached tokens per sequence) and
``preset``; queries and outputs are 16-bit (bfloat16 or float16)."""
from __future__ import annotations

from conformance.cost import Cost

ACT_BYTES = 2


def decode(shape: dict) -> Cost:
    """The compressed cache read once per kv head (``slot_size`` bytes per token and kv head),
    the query and output. FLOPs: Q K^T and P V, 2 L D per query head each."""
    from reference.turboquant.presets import preset

    B, Hk, G, D, L = (shape[k] for k in ("B", "Hk", "G", "D", "L"))
    cache = B * L * Hk * preset(shape["preset"]).slot_size(D)
    return Cost(bytes=cache + 2 * ACT_BYTES * B * Hk * G * D, flops=4 * B * Hk * G * L * D)


def attention_decode_bf16(shape: dict) -> Cost:
    """The same decode on an uncompressed 16-bit cache (what SDPA reads; bfloat16 or float16): K and V,
    2 D bytes per token and kv head each."""
    B, Hk, G, D, L = (shape[k] for k in ("B", "Hk", "G", "D", "L"))
    return Cost(bytes=2 * ACT_BYTES * B * L * Hk * D + 2 * ACT_BYTES * B * Hk * G * D,
                flops=4 * B * Hk * G * L * D)
