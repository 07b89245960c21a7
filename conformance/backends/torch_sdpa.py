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


def _run(cell, inputs: dict) -> dict:
    import numpy as np
    import torch

    from optimized.torch.tq_sdpa import paged_sdpa_decode

    dev = _device()

    def bf16(name):
        return torch.from_numpy(np.ascontiguousarray(inputs[name], dtype=np.float32)).to(dev, torch.bfloat16)

    sinks = None if inputs["sinks"] is None else torch.from_numpy(inputs["sinks"]).to(dev)
    out = paged_sdpa_decode(bf16("query"), bf16("key_cache"), bf16("value_cache"),
                            torch.from_numpy(inputs["block_table"]).to(dev),
                            torch.from_numpy(inputs["seq_lens"]).to(dev), inputs["scale"], sinks)
    return {"out": out.float().cpu().numpy()}


TORCH_SDPA = register(Backend(
    name="torch-sdpa", ops={"turboquant": ("decode",)}, available=_available, run=_run,
    rounding_models={"turboquant": "bf16-sdpa"}, uses_gpu=True))
