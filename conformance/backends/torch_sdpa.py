"""Backend ``torch-sdpa``: TurboQuant-family decode over the UNQUANTIZED bf16 paged cache
(``inputs["key_cache"]``/``["value_cache"]``) with torch SDPA (``optimized.torch.tq_sdpa``), on
CUDA when present, else CPU. It never reads the quantized cache: the family judges it with the
``bf16-sdpa`` rounding model (float64 attention over the unquantized cache, bf16 tolerance)."""
from __future__ import annotations

from conformance.registry import Backend, register


def _device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    return True, f"torch {torch.__version__} on {_device()}"


class TorchSdpaImpl:
    """The decode signature over the unquantized cache (``reads_unquantized``: the family's driver
    passes K and V concatenated on the last axis as ``kv_cache``), computed in bf16 by torch SDPA."""

    reads_unquantized = True

    @staticmethod
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        import numpy as np
        import torch

        from optimized.torch.tq_sdpa import paged_sdpa_decode

        dev = _device()

        def bf16(x):
            return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev, torch.bfloat16)

        D = query.shape[-1]
        out = paged_sdpa_decode(bf16(query), bf16(kv_cache[..., :D]), bf16(kv_cache[..., D:]),
                                torch.from_numpy(np.asarray(block_table)).to(dev),
                                torch.from_numpy(np.asarray(seq_lens)).to(dev), scale,
                                None if sinks is None else torch.from_numpy(np.asarray(sinks)).to(dev))
        return out.float().cpu().numpy()


def _run(cell, inputs: dict) -> dict:
    from conformance.families import turboquant

    return turboquant.run_with(TorchSdpaImpl(), cell, inputs)


TORCH_SDPA = register(Backend(
    name="torch-sdpa", ops={"turboquant": ("decode",)}, available=_available, run=_run,
    rounding_models={"turboquant": "act-sdpa"}, uses_gpu=True))
