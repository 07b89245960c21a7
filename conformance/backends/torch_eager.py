"""Backend ``torch-eager``: the plain-torch chunked GDN (optimized/torch/gdn_chunked.py).

Rounding model "bf16-gemm": bf16 GEMM operands as the CPU chunk kernel, plus bf16-rounded GEMM
results (the gdn family's check widens the bf16-operands tolerance for that).
"""
from __future__ import annotations

import numpy as np

from conformance.registry import Backend, register


def _available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    return True, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def _to_torch(x):
    import torch

    a = np.ascontiguousarray(x)
    if a.dtype.name == "bfloat16":       # ml_dtypes bf16: same bits, reinterpreted
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_numpy(t, like: np.dtype) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(like)
    return t.numpy()


class _NumpyAdapter:
    """The reference's ``chunked`` signature on NumPy arrays, functional form (o, new_state)."""

    @staticmethod
    def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, **kw):
        from optimized.torch.gdn_chunked import chunked

        pool = _to_torch(np.array(state))
        o = chunked(*(_to_torch(x) for x in (q, k, v, g, beta, cu_seqlens)), pool,
                    _to_torch(state_indices), **kw)
        return o.numpy(), _to_numpy(pool, np.asarray(state).dtype)


def _run(cell, inputs):
    from conformance.families import gdn

    return gdn.run_with(_NumpyAdapter, cell, inputs)


TORCH_EAGER = register(Backend(
    name="torch-eager", ops={"gdn": ("chunked",)}, available=_available, run=_run,
    rounding_models={"gdn": "bf16-gemm"}))
