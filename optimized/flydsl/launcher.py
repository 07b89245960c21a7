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
from reference.arguments import indices
from reference.turboquant import validate
from reference.turboquant.lloyd_max import centroids
from reference.turboquant.rotation import check_rotation

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
    """Run the kernel. ``query [B, Hq, 128]`` bfloat16 (its MFMA operands are bf16), ``kv_cache`` uint8 ``[nb, BS, Hk, 134]`` (SoA),
    ``block_table`` int ``[B, M]``, ``seq_lens`` int ``[B]`` (>= 1; both may be Python lists),
    ``rotation [128, 128]`` finite; torch tensors on one device. Every argument is checked before
    the kernel runs, with the references' messages (``reference.turboquant.validate``): finite
    query, scale and rotation, seq_lens within the table, used block ids within the cache."""
    import torch

    from optimized.flydsl.emulation import reduce_partitions

    for name, x in (("query", query), ("kv_cache", kv_cache), ("rotation", rotation)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    B, Hq, Hk, BS = plan.check_request(tuple(query.shape), tuple(kv_cache.shape), preset=preset, layout=layout,
                                       sinks=sinks is not None, act=str(query.dtype).removeprefix("torch."))
    slot = kv_cache.shape[3]
    if kv_cache.dtype != torch.uint8 or slot != SLOT_BYTES:
        raise ValueError(f"kv_cache must be uint8 with {SLOT_BYTES}-byte slots, got {kv_cache.dtype}, {slot}")
    if kv_cache.numel() >= MAX_CACHE_BYTES:
        raise ValueError(f"kv_cache of {kv_cache.numel()} bytes is too large: the kernel addresses < 2 GiB")
    dev = query.device
    tables = [indices(name, x) for name, x in (("block_table", block_table), ("seq_lens", seq_lens))]
    host = [x.cpu().numpy() if isinstance(x, torch.Tensor) else x for x in tables]
    validate.tables(*host, kv_cache.shape[0], BS, B)
    block_table, seq_lens = (torch.as_tensor(x).to(dev) for x in tables)
    validate.floats("query", query.detach().float().cpu().numpy(), 3, "[B, Hq, 128]")
    check_rotation(rotation.detach().cpu().numpy(), HEAD_DIM)
    G, M = Hq // Hk, block_table.shape[1]
    scale = validate.softmax_scale(scale, HEAD_DIM)
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


def decode_into(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation, scale=None, sinks=None,
                out=None):
    """``decode`` with the Triton decodes' result: a tensor of the query's dtype on its device, or
    ``out`` (checked like theirs: ``checks.check_output``) written in place."""
    import torch

    from optimized.triton.checks import FLOAT_DTYPES, check_output

    if out is not None:
        check_output("out", out, tuple(query.shape), FLOAT_DTYPES, query.device)
    res = torch.from_numpy(decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=scale,
                                  sinks=sinks)).to(query.device)
    if out is None:
        return res.to(query.dtype)
    out.copy_(res)
    return out


ENTRY_POINTS = {"decode": decode_into}


def compile_specs():
    """None: FlyDSL kernels are compiled by ``optimized.flydsl.build``, not by Triton's compile check."""
    return []


def problem(*, preset: str, layout: str, D: int, block_size: int, G: int, sinks: bool = False,
            act: str = "bfloat16", device=None) -> str | None:
    """Why this kernel cannot serve a request (None if it can): the shapes and dtype it is built for
    (``plan.unsupported``) and, when a ``device`` is named, whether the real kernel can run here."""
    why = plan.unsupported(preset=preset, layout=layout, D=D, block_size=block_size, G=G, sinks=sinks, act=act)
    if why is None and device is not None:
        ok, here = on_gfx950()
        why = None if ok else here
    return why


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

