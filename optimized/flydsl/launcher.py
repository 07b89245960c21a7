"""Launcher of the FlyDSL TurboQuant decode kernel: shape checks, module cache, partition reduce.

``decode`` takes torch tensors on a ROCm device (gfx950) with the reference's ``decode`` arguments
and returns float32 ``[B, Hq, 128]``. Shapes the kernel does not support raise ``ValueError`` with
the reason (``plan.unsupported``). Compiled modules are cached by
``(G, block_size, Hk, M, num_parts, scale)``; the batch size is a runtime argument.
The partitions are merged on the host by ``emulation.reduce_partitions`` (the same fp32 formula
the emulation uses), so the kernel and its emulation share one reduce.
"""
from __future__ import annotations

from optimized.flydsl import plan
from optimized.flydsl.tq_decode_kernel import HEAD_DIM, SLOT_BYTES, build_tq_decode
from reference.turboquant.lloyd_max import centroids

_MODULES: dict[tuple, object] = {}
MAX_CACHE_BYTES = 2**31  # the kernel's byte offsets are 32-bit


def module(*, G: int, block_size: int, Hk: int, max_blocks: int, scale: float):
    """The compiled kernel for this shape (built on first use, then cached)."""
    parts = plan.num_parts(max_blocks, block_size)
    key = (G, block_size, Hk, max_blocks, parts, round(float(scale), 8))
    if key not in _MODULES:
        _MODULES[key] = build_tq_decode(G=G, block_size=block_size, Hk=Hk, max_blocks=max_blocks,
                                        num_parts=parts, tiles_per_part=plan.TILES_PER_PART, scale=scale)
    return _MODULES[key]


def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
    """Run the kernel. ``query [B, Hq, 128]`` float, ``kv_cache`` uint8 ``[nb, BS, Hk, 134]`` (SoA),
    ``block_table`` int32 ``[B, M]``, ``seq_lens`` int32 ``[B]`` (>= 1), ``rotation [128, 128]``;
    all torch tensors on one device."""
    import torch

    from optimized.flydsl.emulation import reduce_partitions

    B, Hq, Hk, BS = plan.check_request(tuple(query.shape), tuple(kv_cache.shape), preset=preset, layout=layout,
                                       sinks=sinks is not None)
    slot = kv_cache.shape[3]
    if kv_cache.dtype != torch.uint8 or slot != SLOT_BYTES:
        raise ValueError(f"kv_cache must be uint8 with {SLOT_BYTES}-byte slots, got {kv_cache.dtype}, {slot}")
    if kv_cache.numel() >= MAX_CACHE_BYTES:
        raise ValueError(f"kv_cache of {kv_cache.numel()} bytes is too large: the kernel addresses < 2 GiB")
    if block_table.shape[0] != B or tuple(seq_lens.shape) != (B,):
        raise ValueError(f"block_table must be [B={B}, M] and seq_lens [B={B}]")
    if int(seq_lens.min()) < 1 or int(seq_lens.max()) > block_table.shape[1] * BS:
        raise ValueError(f"seq_lens must be in [1, {block_table.shape[1] * BS}]")
    G, M = Hq // Hk, block_table.shape[1]
    scale = HEAD_DIM ** -0.5 if scale is None else float(scale)
    dev = query.device
    q_rot = (query.float() @ rotation.to(dev, torch.float32)).to(torch.bfloat16).contiguous()
    cent = torch.from_numpy(centroids(4, HEAD_DIM)).to(dev)
    P = plan.num_parts(M, BS)
    o = torch.empty(B, Hk, P, 16, HEAD_DIM, device=dev, dtype=torch.float32)
    m = torch.empty(B, Hk, P, 16, device=dev, dtype=torch.float32)
    l = torch.empty(B, Hk, P, 16, device=dev, dtype=torch.float32)
    fn = module(G=G, block_size=BS, Hk=Hk, max_blocks=M, scale=scale)
    fn(q_rot, kv_cache.reshape(-1).contiguous(), block_table.to(torch.int32).contiguous(),
       seq_lens.to(torch.int32).contiguous(), cent, o, m, l, B)
    # Rows >= G of the 16 MFMA rows repeat row G - 1 and are dropped here.
    return reduce_partitions(o[..., :G, :].cpu().numpy(), m[..., :G].cpu().numpy(), l[..., :G].cpu().numpy())


def on_gfx950() -> tuple[bool, str]:
    """Whether the real kernel can run here: FlyDSL importable and a gfx950 device visible."""
    try:
        import flydsl  # noqa: F401
    except ImportError as exc:
        return False, f"FlyDSL is not importable ({exc})"
    try:
        import torch
    except ImportError:
        return False, "torch is not importable"
    if not (torch.cuda.is_available() and getattr(torch.version, "hip", None)):
        return False, "no ROCm GPU visible to torch"
    arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    if arch != "gfx950":
        return False, f"the GPU is {arch}, the kernel needs gfx950 (CDNA4 MFMA 16x16x32 bf16)"
    return True, f"gfx950 ({torch.cuda.get_device_name(0)}), FlyDSL {getattr(flydsl, '__version__', '?')}"

