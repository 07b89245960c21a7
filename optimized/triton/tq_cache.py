"""What the TurboQuant Triton kernels need to know about a cache: its preset, head size, kv heads,
block size and layout, turned into the compile-time constants of the kernels.

Sizes and offsets come from ``reference.turboquant.presets`` / ``layout`` (the one definition of the
byte format); this module only checks a torch cache tensor
against them and names the constants. The cache is a uint8 tensor of logical shape
``[num_blocks, block_size, Hk, slot_size]``. AoS kernels address it through its strides
(block-major or head-major physical order both work; the slot bytes must be contiguous); SoA
kernels use only ``stride(0)`` and need each block's bytes contiguous in the row-major order.
"""
from __future__ import annotations

from dataclasses import dataclass

from optimized.triton.checks import check_no_overlap
from reference.turboquant.layout import check_layout
from reference.turboquant.presets import Preset, preset as lookup_preset

HEAD_SIZES = (64, 128, 256)  # powers of two: tl.arange over D, and the Sylvester Hadamard


@dataclass(frozen=True)
class CacheSpec:
    preset: Preset
    head_size: int
    num_kv_heads: int
    block_size: int
    layout: str

    @property
    def soa(self) -> bool:
        return self.layout == "soa"

    @property
    def key_bytes(self) -> int:
        return self.preset.key_data_bytes(self.head_size)

    @property
    def value_bytes(self) -> int:
        return self.preset.value_data_bytes(self.head_size)

    @property
    def slot_size(self) -> int:
        return self.preset.slot_size(self.head_size)

    def constexprs(self) -> dict:
        """Keyword constants shared by every kernel that reads or writes the cache."""
        p = self.preset
        return dict(SOA=self.soa, KEY_FP8=p.key_fp8, KEY_BITS=p.key_bits, VAL_BITS=p.value_bits,
                    D=self.head_size, HK=self.num_kv_heads, BS=self.block_size,
                    KEY_BYTES=self.key_bytes, VAL_BYTES=self.value_bytes)


def head_size_problem(D: int) -> str | None:
    """Why the Triton kernels cannot take head size ``D``, or None."""
    if D not in HEAD_SIZES:
        return f"the Triton kernels support head sizes {HEAD_SIZES} (powers of two), got {D}"
    return None


def cache_spec(kv_cache, preset, head_size: int, num_kv_heads: int, layout: str) -> CacheSpec:
    """Check ``kv_cache`` (torch uint8 ``[num_blocks, block_size, Hk, slot_size]``) against the
    preset, head size and layout, and that no two slots share bytes (the store writes through
    these strides); ValueError naming ``kv_cache`` (or the argument) on a mismatch."""
    import torch

    p = lookup_preset(preset)
    check_layout(layout)
    if head_size not in HEAD_SIZES:
        raise ValueError(f"head size D must be one of {HEAD_SIZES} for the Triton kernels, got {head_size}")
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache must be a torch uint8 tensor, got {getattr(kv_cache, 'dtype', type(kv_cache))}")
    slot = p.slot_size(head_size)
    shape = tuple(kv_cache.shape)
    if kv_cache.dim() != 4 or shape[2] != num_kv_heads or shape[3] != slot or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"kv_cache must have shape [num_blocks, block_size, {num_kv_heads}, {slot}] for "
                         f"{p.name}, D={head_size}, Hk={num_kv_heads}; got {list(shape)}")
    bs = shape[1]
    if kv_cache.stride(3) != 1:
        raise ValueError(f"kv_cache slot bytes must be contiguous (stride(3) == 1), got strides {kv_cache.stride()}")
    if layout == "soa":
        if kv_cache.stride(1) != num_kv_heads * slot or kv_cache.stride(2) != slot:
            raise ValueError("kv_cache in the soa layout must have contiguous blocks "
                             f"(strides [*, {num_kv_heads * slot}, {slot}, 1]), got {kv_cache.stride()}")
    if any(s % 2 for s in kv_cache.stride()[:3]) or kv_cache.data_ptr() % 2:
        raise ValueError(f"kv_cache strides and start must be even (fp16 metadata), got {kv_cache.stride()}")
    check_no_overlap("kv_cache", kv_cache)
    return CacheSpec(p, head_size, num_kv_heads, bs, layout)
