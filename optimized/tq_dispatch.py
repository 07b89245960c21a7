"""The TurboQuant decode to run for a device and a request: the fastest conformant kernel that serves it.

The kernels are the TurboQuant launchers of ``optimized.launchers.LAUNCHERS`` with a ``decode`` entry point,
fastest first (H200 measurements in ledger/h200/README.md): ``triton-sm90`` (Gluon, operands in
registers; NVIDIA compute capability 9.0, SoA turboquant_4bit_nc, bfloat16 or float16 queries),
``flydsl-gfx950`` (AMD gfx950, SoA turboquant_4bit_nc, D=128, block 16/32, G in {6, 8, 16}, no sinks,
bfloat16 queries), ``triton-grouped`` (portable grouped decode, SoA turboquant_4bit_nc), ``triton-split``
(portable, every preset and layout). ``decode(..., kernel="auto")`` runs the first that serves the request;
naming a kernel runs that one or raises ValueError saying why it cannot serve the request.
"""
from __future__ import annotations

from optimized import launchers

KERNELS = launchers.serving("turboquant", "decode")


def problem(kernel: str, query, kv_cache, *, preset: str, layout: str, sinks=None) -> str | None:
    """Why ``kernel`` cannot serve this decode (``query [B, Hq, D]`` float, ``kv_cache [nb, BS, Hk, slot]``
    uint8 torch tensors, else TypeError/ValueError naming the argument), or None: its launcher's
    ``problem`` on the request's shapes, dtype and device."""
    from optimized.triton.checks import FLOAT_DTYPES, check_tensor
    from reference.turboquant.presets import preset as lookup

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
    check_tensor("query", query, (None, None, None), FLOAT_DTYPES)
    check_tensor("kv_cache", kv_cache, (None, None, None, None), ("uint8",))
    return launchers.module(kernel).problem(
        preset=lookup(preset).name, layout=layout, D=query.shape[-1], block_size=kv_cache.shape[1],
        G=query.shape[1] // max(kv_cache.shape[2], 1), sinks=sinks is not None,
        act=str(query.dtype).removeprefix("torch."), device=kv_cache.device)


def choose(query, kv_cache, *, preset: str, layout: str, sinks=None) -> str:
    """The fastest kernel of ``KERNELS`` that serves the request; ValueError listing each one's reason
    when none does."""
    reasons = {}
    for kernel in KERNELS:
        why = problem(kernel, query, kv_cache, preset=preset, layout=layout, sinks=sinks)
        if why is None:
            return kernel
        reasons[kernel] = why
    raise ValueError(f"no TurboQuant decode serves this request: {reasons}")


def decode(query, kv_cache, block_table, seq_lens, *, preset: str, layout: str, rotation=None, scale=None,
           sinks=None, kernel: str = "auto", **launch):
    """Decode with ``kernel`` (``"auto"``: ``choose``); the arguments and result of
    ``tq_decode_split.decode_split``. ``launch`` (workspace, out, num_kv_splits, ...) goes to the kernel's
    launcher (the FlyDSL launcher takes ``out`` only)."""
    if kernel == "auto":
        kernel = choose(query, kv_cache, preset=preset, layout=layout, sinks=sinks)
    else:
        why = problem(kernel, query, kv_cache, preset=preset, layout=layout, sinks=sinks)
        if why:
            raise ValueError(f"kernel {kernel!r} cannot serve this decode: {why}")
    return launchers.entry(kernel, "decode")(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                                             rotation=rotation, scale=scale, sinks=sinks, **launch)
