"""NumPy emulation of the FlyDSL TurboQuant decode kernel's arithmetic (``tq_decode_kernel``).

It follows the kernel step by step, with the kernel's rounding points:

* ``q_rot = bf16(f32(q) @ R)`` (the launcher's rotation, then the kernel's bf16 A operand);
* per 32-token tile: ``K = bf16(c[idx] * f32(k_norm16))``, scores ``f32(q_rot . K) * scale``
  (bf16 products are exact in fp32; the sum is fp32), masked to -inf past ``seq_len``;
* online softmax per query row in fp32 with ``exp2((s - m) * log2e)`` and a running max
  (``m`` stays -inf until a valid token; then ``m_safe = 0`` is used for an all -inf row);
  ``l = l * alpha + sum(p)`` on the unrounded p;
* ``P = bf16(p)``, ``V = bf16(code * f32(v_scale16) + f32(v_zero16))``, ``acc = acc * alpha + P @ V``
  in fp32;
* per partition ``o = acc / l`` (0 when l == 0), then ``reduce_partitions`` merges the partitions:
  ``M = max_p m_p``, ``w_p = l_p * exp(m_p - M)``, ``out = sum_p w_p o_p / sum_p w_p`` (fp32).

The emulation is vectorised over kv heads and query rows; it loops over sequences, partitions and
tiles exactly as the kernel's grid and loop do, and skips tiles past ``seq_len`` (in the kernel they
are fully masked, so alpha = 1 and p = 0: the same numbers).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from optimized.flydsl import plan
from optimized.flydsl.tq_decode_kernel import HEAD_DIM, LOG2E, TILE_TOKENS
from reference.turboquant import layout as tq_layout
from reference.turboquant import validate
from reference.turboquant.lloyd_max import centroids
from reference.turboquant.numpy_ref import read_fields
from reference.turboquant.presets import preset as get_preset

F32 = np.float32


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and back to float32."""
    return np.asarray(x, dtype=F32).astype(ml_dtypes.bfloat16).astype(F32)


def rotate_query(query: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``bf16(f32(query) @ R)``, float32 ``[B, Hq, D]`` holding bf16 values."""
    return bf16(np.asarray(query, dtype=F32) @ np.asarray(rotation, dtype=F32))


def partitions(q_rot, kv_cache, block_table, seq_lens, scale: float, G: int):
    """The kernel's per-partition outputs. ``q_rot`` float32 (bf16 values) ``[B, Hk*G, 128]``;
    ``kv_cache`` uint8 ``[nb, BS, Hk, 134]`` (SoA). Returns ``o [B, Hk, P, G, 128]``,
    ``m [B, Hk, P, G]``, ``l [B, Hk, P, G]`` float32."""
    p = get_preset(plan.PRESET)
    _, BS, Hk, _ = kv_cache.shape
    B = q_rot.shape[0]
    P = plan.num_parts(block_table.shape[1], BS)
    c = centroids(p.key_bits, HEAD_DIM)
    q = q_rot.reshape(B, Hk, G, HEAD_DIM).astype(F32)
    o = np.zeros((B, Hk, P, G, HEAD_DIM), F32)
    m_out = np.full((B, Hk, P, G), -np.inf, F32)
    l_out = np.zeros((B, Hk, P, G), F32)
    for b in range(B):
        L = int(seq_lens[b])
        for part in range(P):
            m = np.full((Hk, G), -np.inf, F32)
            l = np.zeros((Hk, G), F32)
            acc = np.zeros((Hk, G, HEAD_DIM), F32)
            for j in range(plan.TILES_PER_PART):
                t = (part * plan.TILES_PER_PART + j) * TILE_TOKENS + np.arange(TILE_TOKENS)
                valid = t < L
                if not valid.any():
                    break
                t_safe = np.where(valid, t, 0)
                slots = block_table[b, t_safe // BS].astype(np.int64) * BS + t_safe % BS
                f = read_fields(kv_cache, slots, p, plan.LAYOUT, HEAD_DIM)          # [32, Hk, ...]
                k = bf16(c[f["key_codes"]] * f["k_norm"].astype(F32)[..., None])     # [32, Hk, D]
                v = bf16(f["value_codes"].astype(F32) * f["v_scale"].astype(F32)[..., None]
                         + f["v_zero"].astype(F32)[..., None])
                s = np.einsum("hgd,thd->hgt", q[b], k, dtype=F32) * F32(scale)          # [Hk, G, 32]
                s = np.where(valid, s, F32(-np.inf)).astype(F32)
                m_new = np.maximum(m, s.max(axis=-1))
                m_safe = np.where(m_new == -np.inf, F32(0), m_new)
                alpha = np.exp2((m - m_safe) * F32(LOG2E)).astype(F32)
                pr = np.exp2((s - m_safe[..., None]) * F32(LOG2E)).astype(F32)
                l = (l * alpha + pr.sum(axis=-1, dtype=F32)).astype(F32)
                acc = (acc * alpha[..., None] + np.einsum("hgt,thd->hgd", bf16(pr), v, dtype=F32)).astype(F32)
                m = m_new
            has = l > 0
            o[b, :, part] = np.where(has[..., None], acc / np.where(has, l, F32(1))[..., None], F32(0))
            m_out[b, :, part], l_out[b, :, part] = m, l
    return o, m_out, l_out


def reduce_partitions(o, m, l) -> np.ndarray:
    """Merge partitions ``o [B, Hk, P, G, D]``, ``m, l [B, Hk, P, G]`` -> float32 ``[B, Hk*G, D]``."""
    o, m, l = (np.asarray(a, dtype=F32) for a in (o, m, l))
    B, Hk, P, G, D = o.shape
    mx = m.max(axis=2, keepdims=True)
    w = np.where(m == -np.inf, F32(0), l * np.exp(m - np.where(mx == -np.inf, F32(0), mx))).astype(F32)
    den = w.sum(axis=2, dtype=F32)
    num = np.einsum("bhpg,bhpgd->bhgd", w, o, dtype=F32)
    out = np.where(den[..., None] > 0, num / np.where(den > 0, den, F32(1))[..., None], F32(0))
    return out.reshape(B, Hk * G, D).astype(F32)


def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None,
           num_kv_splits: int = 1):
    """The reference ``decode`` signature, computed the way the kernel computes it; ``query`` bfloat16
    (ml_dtypes), as the kernel takes it (any other dtype: ValueError naming it).
    ``num_kv_splits`` is accepted and ignored: the kernel's partitions come from the block table."""
    q = np.asarray(query)
    kv_cache = np.asarray(kv_cache)
    if q.ndim != 3:
        raise ValueError(f"query must be a bfloat16 [B, Hq, D] array, got dtype {q.dtype} shape {list(q.shape)}")
    if kv_cache.ndim != 4 or kv_cache.dtype != np.uint8:
        raise ValueError(f"kv_cache must be uint8 [num_blocks, block_size, Hk, slot], got {kv_cache.dtype} "
                         f"{list(kv_cache.shape)}")
    B, Hq, Hk, BS = plan.check_request(q.shape, kv_cache.shape, preset=preset, layout=layout,
                                       sinks=sinks is not None, act=q.dtype.name)
    D = q.shape[2]
    tq_layout.check_cache(kv_cache, get_preset(preset), D, Hk)
    bt, lens = validate.tables(block_table, seq_lens, kv_cache.shape[0], BS, B)   # the launcher's checks
    validate.floats("query", q.astype(F32), 3, "[B, Hq, 128]")
    scale = validate.softmax_scale(scale, D)
    o, m, l = partitions(rotate_query(q, rotation), kv_cache, bt, lens, scale, Hq // Hk)
    return reduce_partitions(o, m, l)
