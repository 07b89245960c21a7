"""The TurboQuant preset table and the packed sizes it implies.

A key is either MSE-quantized (``key_bits`` 3 or 4: Lloyd-Max code per coordinate of the rotated
unit vector, plus an fp16 norm) or cast to FP8 E4M3 (``key_fp8``: one byte per element, no norm,
no rotation). A value is uniform ``value_bits``-bit with an fp16 scale and an fp16 zero point.
``norm_correction`` rescales the centroid vector to unit norm before the stored norm is applied.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass


def check_head_size(D) -> int:
    """``D`` as an int; ValueError unless it is a positive multiple of 16."""
    if isinstance(D, bool) or not isinstance(D, numbers.Integral):
        raise TypeError(f"D (head size) must be an integer, got {type(D).__name__}")
    D = int(D)
    if D <= 0 or D % 16:
        raise ValueError(f"D (head size) must be a positive multiple of 16, got {D}")
    return D


@dataclass(frozen=True)
class Preset:
    """One ``--kv-cache-dtype`` value: how keys and values are stored."""

    name: str
    key_fp8: bool
    key_bits: int  # 8 for FP8 keys, else the MSE code width (3 or 4)
    value_bits: int
    norm_correction: bool

    def key_data_bytes(self, D: int) -> int:
        """Bytes of key codes per (token, kv head): D for FP8, else ceil(D * key_bits / 8)."""
        D = check_head_size(D)
        return D if self.key_fp8 else -(-D * self.key_bits // 8)

    def value_data_bytes(self, D: int) -> int:
        """Bytes of value codes per (token, kv head): ceil(D * value_bits / 8)."""
        return -(-check_head_size(D) * self.value_bits // 8)

    def key_packed_size(self, D: int) -> int:
        """Key codes plus the fp16 norm (MSE keys only)."""
        return self.key_data_bytes(D) + (0 if self.key_fp8 else 2)

    def value_packed_size(self, D: int) -> int:
        """Value codes plus fp16 scale and fp16 zero."""
        return self.value_data_bytes(D) + 4

    def slot_size(self, D: int) -> int:
        """Bytes per (token, kv head) in the cache, rounded up to even (134 for 4bit_nc, D=128)."""
        size = self.key_packed_size(D) + self.value_packed_size(D)
        return size + (size % 2)

    @property
    def num_soa_fields(self) -> int:
        """fp16 metadata fields per (token, head) in the SoA layout: k_norm, v_scale, v_zero (FP8: 2)."""
        return 2 if self.key_fp8 else 3


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("turboquant_k8v4", key_fp8=True, key_bits=8, value_bits=4, norm_correction=False),
        Preset("turboquant_4bit_nc", key_fp8=False, key_bits=4, value_bits=4, norm_correction=True),
        Preset("turboquant_k3v4_nc", key_fp8=False, key_bits=3, value_bits=4, norm_correction=True),
        Preset("turboquant_3bit_nc", key_fp8=False, key_bits=3, value_bits=3, norm_correction=True),
    )
}


def preset(name) -> Preset:
    """The preset called ``name`` (a Preset passes through); ValueError naming the known ones."""
    if isinstance(name, Preset):
        return name
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[name]
