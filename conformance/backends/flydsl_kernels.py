"""FlyDSL TurboQuant decode backends (``optimized/flydsl``).

- ``flydsl-emulated``: the NumPy emulation of the gfx950 kernel's arithmetic (its partitions, bf16
  rounding of q_rot, K, V and P, fp32 accumulation, the partition reduce); runs anywhere.
- ``flydsl-gfx950``: the real kernel; available only with FlyDSL importable and a gfx950 GPU.

Both run the ``decode`` op on the cells the kernel supports (``optimized.flydsl.plan``:
turboquant_4bit_nc, SoA, D = 128, block 16/32, G in {6, 8, 16}, no sinks, bfloat16 queries: its MFMA
operands are bf16); other cells are skips with the reason. Rounding model: the family's ``act-mma``.
"""
from __future__ import annotations

from conformance import paths
from conformance.cells import Cell, activation
from conformance.registry import Backend, register


def _supports(cell: Cell) -> str | None:
    from optimized.flydsl import launcher

    return launcher.problem(preset=cell["preset"], layout=cell["layout"], D=cell["D"], block_size=cell["bs"],
                            G=cell["G"], sinks=bool(cell["sinks"]), act=activation(cell))


class _DecodeOnly:
    """The family's ``impl`` protocol (``store`` and ``decode``) for a decode-only kernel."""

    def __init__(self, decode):
        self.decode = decode

    @staticmethod
    def store(*args, **kwargs):
        raise NotImplementedError("the FlyDSL backends implement decode only (the store is the reference's)")


def _run_emulated(cell: Cell, inputs: dict) -> dict:
    from conformance.families.turboquant import run_with
    from optimized.flydsl import emulation

    return run_with(_DecodeOnly(emulation.decode), cell, inputs)


def _decode_on_gpu(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
    import torch

    from conformance.torch_arrays import to_torch
    from optimized.flydsl import launcher

    dev = torch.device("cuda")
    out = launcher.decode(to_torch(query, dev), to_torch(kv_cache, dev), to_torch(block_table, dev),
                          to_torch(seq_lens, dev), preset, layout, to_torch(rotation), scale=scale, sinks=sinks)
    torch.cuda.synchronize()
    return out


def _run_gfx950(cell: Cell, inputs: dict) -> dict:
    from conformance.families.turboquant import run_with

    return run_with(_DecodeOnly(_decode_on_gpu), cell, inputs)


def _gfx950_available() -> tuple[bool, str]:
    from optimized.flydsl.launcher import on_gfx950

    return on_gfx950()


register(Backend(
    name="flydsl-emulated",
    ops={"turboquant": ("decode",)},
    available=lambda: (True, "NumPy emulation of the FlyDSL gfx950 kernel's arithmetic"),
    run=_run_emulated,
    supports=_supports,
    rounding_models={"turboquant": "act-mma"},
    path=paths.fixed("gfx950-emulated"),
))

register(Backend(
    name="flydsl-gfx950",
    ops={"turboquant": ("decode",)},
    available=_gfx950_available,
    run=_run_gfx950,
    supports=_supports,
    uses_gpu=True,
    rounding_models={"turboquant": "act-mma"},
    path=paths.fixed("gfx950"),
))
