"""Decode attention over an UNQUANTIZED paged KV cache (bf16, fp16 or fp32) with
``torch.nn.functional.scaled_dot_product_attention``: what a user runs without TurboQuant, and
the speed baseline for the TurboQuant GPU kernels. Runs on CPU and CUDA (whatever device the
tensors are on).

Shapes: query ``[B, Hq, D]``; key_cache/value_cache ``[num_blocks, block_size, Hk, D]``;
block_table int ``[B, M]`` (extra columns ignored); seq_lens int ``[B]``; sinks None or
``[Hq]`` raw logits (added once to each softmax denominator). Query head ``hq`` reads kv head
``hq // (Hq // Hk)``. Rounding: SDPA's own, in the query dtype (the cache is converted to it;
16-bit logits/probabilities depending on the SDPA backend); output in the query dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from reference.arguments import indices
from reference.turboquant.validate import softmax_scale


def paged_sdpa_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One-token decode per sequence, all sequences in one SDPA call (padded to the longest,
    padding masked out; a sink is an extra zero key/value column whose additive bias is the sink
    logit). Returns ``[B, Hq, D]`` in ``query.dtype``. ``block_table`` and ``seq_lens`` may be Python
    lists (converted); a NaN or Inf in ``query``, ``scale`` or ``sinks`` is refused by name."""
    for name, x in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    block_table, seq_lens = (torch.as_tensor(indices(n, x), device=query.device)
                             for n, x in (("block_table", block_table), ("seq_lens", seq_lens)))
    if query.ndim != 3:
        raise ValueError(f"query must be [B, Hq, D], got shape {list(query.shape)}")
    B, Hq, D = query.shape
    if key_cache.ndim != 4 or key_cache.shape != value_cache.shape or key_cache.shape[3] != D:
        raise ValueError(f"key_cache/value_cache must both be [num_blocks, block_size, Hk, D={D}], "
                         f"got {list(key_cache.shape)} and {list(value_cache.shape)}")
    scale = softmax_scale(scale, D)
    if not bool(torch.isfinite(query).all()):
        raise ValueError("query holds NaN or Inf")
    if sinks is not None and not bool(torch.isfinite(sinks).all()):
        raise ValueError("sinks holds NaN or Inf")
    num_blocks, bs, Hk, _ = key_cache.shape
    if Hq % Hk:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of kv heads Hk={Hk}")
    if block_table.ndim != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"block_table must be [B={B}, M] and seq_lens [B={B}], got "
                         f"{list(block_table.shape)} and {list(seq_lens.shape)}")
    lens = seq_lens.to(torch.int64)
    L = int(lens.max())
    if int(lens.min()) < 1 or L > block_table.shape[1] * bs:
        raise ValueError(f"seq_lens must be in [1, {block_table.shape[1] * bs}]")
    t = torch.arange(L, device=query.device)
    blocks = block_table.to(torch.int64)[:, t // bs]  # [B, L]
    valid = t[None, :] < lens[:, None]
    if bool(((blocks < 0) | (blocks >= num_blocks))[valid].any()):
        raise ValueError(f"block_table uses a block outside [0, {num_blocks})")
    slots = torch.where(valid, blocks * bs + t % bs, 0)
    keep = valid[:, :, None, None]
    k = torch.where(keep, key_cache.reshape(-1, Hk, D)[slots], 0).to(query.dtype)  # [B, L, Hk, D]
    v = torch.where(keep, value_cache.reshape(-1, Hk, D)[slots], 0).to(query.dtype)
    bias = torch.zeros(B, 1, 1, L, dtype=query.dtype, device=query.device)
    bias = bias.masked_fill(~valid[:, None, None, :], float("-inf")).expand(B, Hq, 1, L)
    if sinks is not None:
        zero = torch.zeros(B, 1, Hk, D, dtype=query.dtype, device=query.device)
        k, v = torch.cat([k, zero], dim=1), torch.cat([v, zero], dim=1)
        sink_bias = sinks.to(query.dtype).reshape(1, Hq, 1, 1).expand(B, Hq, 1, 1)
        bias = torch.cat([bias, sink_bias], dim=-1)
    out = F.scaled_dot_product_attention(
        query[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias,
        scale=scale, enable_gqa=Hq != Hk)
    return out[:, :, 0, :]
