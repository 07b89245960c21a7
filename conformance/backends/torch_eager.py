"""Backend ``torch-eager``: the plain-torch chunked GDN (optimized/torch/gdn_chunked.py).

Rounding model "bf16-gemm": bf16 GEMM operands as the CPU chunk kernel, plus bf16-rounded GEMM
results (the gdn family's check widens the bf16-operands tolerance for that).
"""
from __future__ import annotations

import numpy as np

from conformance import paths
from conformance.registry import Backend, register
from conformance.torch_arrays import to_numpy, to_torch


def _available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    return True, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


class _NumpyAdapter:
    """The reference's ``chunked`` signature on NumPy arrays, functional form (o, new_state)."""

    @staticmethod
    def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, **kw):
        from optimized.torch.gdn_chunked import chunked

        pool = to_torch(np.array(state))
        o = chunked(*(to_torch(x) for x in (q, k, v, g, beta, cu_seqlens)), pool,
                    to_torch(state_indices), **kw)
        return o.numpy(), to_numpy(pool)


def _run(cell, inputs):
    from conformance.families import gdn

    return gdn.run_with(_NumpyAdapter, cell, inputs)


TORCH_EAGER = register(Backend(
    name="torch-eager", ops={"gdn": ("chunked",)}, available=_available, run=_run,
    rounding_models={"gdn": "bf16-gemm"}, path=paths.fixed("cpu")))
