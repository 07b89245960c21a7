"""Backend ``torch-sdpa``: TurboQuant-family decode over the UNQUANTIZED paged cache
(``inputs["key_cache"]``/``["value_cache"]``) with torch SDPA (``optimized.torch.tq_sdpa``) in the activation
dtype (the query's: bfloat16, float16 or float32; the cache is converted to it, holding the same values),
on CUDA when present, else CPU; the output is in that dtype. It never reads the quantized cache: the family
judges it with the ``act-sdpa`` rounding model (float64 attention over the unquantized cache, the activation
dtype's tolerance)."""
from __future__ import annotations

from conformance import paths
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
    passes K and V concatenated on the last axis as ``kv_cache``, float32), computed by torch SDPA in
    the query's dtype."""

    reads_unquantized = True

    @staticmethod
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        from conformance.torch_arrays import to_numpy, to_torch
        from optimized.torch.tq_sdpa import paged_sdpa_decode

        dev = _device()
        q = to_torch(query, dev)
        D = query.shape[-1]
        k, v = (to_torch(x, dev).to(q.dtype) for x in (kv_cache[..., :D], kv_cache[..., D:]))
        out = paged_sdpa_decode(q, k, v, to_torch(block_table, dev), to_torch(seq_lens, dev), scale,
                                to_torch(sinks, dev))
        return to_numpy(out)


def _supports(cell) -> str | None:
    if cell.source is not None:
        return "reads the unquantized keys and values, which a captured cache (--inputs) does not hold"
    return None


def _run(cell, inputs: dict) -> dict:
    from conformance.families import turboquant

    return turboquant.run_with(TorchSdpaImpl(), cell, inputs)


TORCH_SDPA = register(Backend(
    name="torch-sdpa", ops={"turboquant": ("decode",)}, available=_available, run=_run,
    supports=_supports, rounding_models={"turboquant": "act-sdpa"}, uses_gpu=True,
    path=lambda cell: paths.gpu_arch() or "cpu"))
