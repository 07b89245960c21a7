"""What the FlyDSL TurboQuant decode kernel supports, and how it splits a sequence.

Supported: preset ``turboquant_4bit_nc``, SoA layout, D = 128, block size 16 or 32,
G = Hq / Hk in {6, 8, 16}, no sinks, bfloat16 queries (its MFMA operands are bf16:
``mfma_f32_16x16x32_bf16``; a float16 query would be rounded to bf16). Every other case is refused
with the reason (the other backends cover it).

Partitioning (shared by the kernel, its launcher and the NumPy emulation): tiles of 32 tokens,
``TILES_PER_PART`` tiles per partition, and ``num_parts = ceil(M * block_size / PART_TOKENS)``
partitions sized from the block-table width M (not from seq_lens), so the compiled module does
not change with the batch's lengths.
"""
from __future__ import annotations

from optimized.flydsl.tq_decode_kernel import HEAD_DIM, TILE_TOKENS

PRESET = "turboquant_4bit_nc"
LAYOUT = "soa"
BLOCK_SIZES = (16, 32)
GROUPS = (6, 8, 16)
TILES_PER_PART = 2
PART_TOKENS = TILES_PER_PART * TILE_TOKENS


ACT = "bfloat16"


def unsupported(*, preset: str, layout: str, D: int, block_size: int, G: int, sinks: bool, act: str) -> str | None:
    """``None`` when the kernel runs this shape and query dtype ``act`` (a dtype name), else the reason in words."""
    name = getattr(preset, "name", preset)
    if name != PRESET:
        return f"flydsl kernel supports only {PRESET} (4-bit keys and values), not {name}"
    if layout != LAYOUT:
        return f"flydsl kernel reads only the SoA cache layout, not {layout}"
    if D != HEAD_DIM:
        return f"flydsl kernel is built for head size {HEAD_DIM}, not {D}"
    if block_size not in BLOCK_SIZES:
        return f"flydsl kernel supports block sizes {BLOCK_SIZES}, not {block_size}"
    if G not in GROUPS:
        return f"flydsl kernel supports GQA groups G = Hq/Hk in {GROUPS}, not {G}"
    if sinks:
        return "flydsl kernel does not implement attention sinks"
    return act_problem(act)


def act_problem(act: str) -> str | None:
    """``None`` for a query dtype (name) the kernel takes, else the reason in words."""
    if act != ACT:
        return (f"flydsl kernel's MFMA operands are bf16 (mfma_f32_16x16x32_bf16), so it takes {ACT} queries "
                f"only, not {act}")
    return None


def num_parts(max_blocks: int, block_size: int) -> int:
    """Partitions of one sequence: enough ``PART_TOKENS`` spans to cover the block table."""
    if max_blocks < 1:
        raise ValueError(f"block_table must have at least one column, got {max_blocks}")
    return -(-(max_blocks * block_size) // PART_TOKENS)


def check_request(query_shape, cache_shape, *, preset: str, layout: str, sinks: bool,
                  act: str) -> tuple[int, int, int, int]:
    """``(B, Hq, Hk, block_size)`` of a decode request ``query [B, Hq, D]`` of dtype ``act``, ``kv_cache [nb,
    BS, Hk, slot]`` that the kernel supports; ValueError naming what is wrong otherwise."""
    if len(query_shape) != 3 or len(cache_shape) != 4:
        raise ValueError(f"query must be [B, Hq, D] and kv_cache [nb, BS, Hk, slot]; got {list(query_shape)} "
                         f"and {list(cache_shape)}")
    if act_problem(act):
        raise ValueError(f"query: {act_problem(act)}")
    B, Hq, D = query_shape
    _, BS, Hk, _ = cache_shape
    if Hq % Hk:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of the cache's kv heads Hk={Hk}")
    reason = unsupported(preset=preset, layout=layout, D=D, block_size=BS, G=Hq // Hk, sinks=sinks, act=act)
    if reason:
        raise ValueError(reason)
    return B, Hq, Hk, BS
