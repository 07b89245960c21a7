"""NumPy <-> torch on the CPU without copies or dtype changes: ml_dtypes bfloat16 arrays travel as
torch.bfloat16 (the same bits), every other dtype as itself."""
from __future__ import annotations

import numpy as np


def to_torch(x):
    """``x`` (NumPy, ml_dtypes bf16 included) as a CPU torch tensor of the same dtype (C-contiguous;
    shares memory when ``x`` already is)."""
    import torch

    a = np.ascontiguousarray(x)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t) -> np.ndarray:
    """A torch tensor (any device) as a NumPy array of the same dtype (torch.bfloat16 as ml_dtypes bf16)."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
