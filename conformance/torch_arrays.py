"""NumPy <-> torch without dtype changes: ml_dtypes bfloat16 arrays travel as torch.bfloat16 (the same
bits), every other dtype as itself. A backend that needs another dtype says so where it converts."""
from __future__ import annotations

import numpy as np


def to_torch(x, device=None):
    """``x`` (NumPy, ml_dtypes bf16 included; or None, returned as is) as a torch tensor of the same dtype
    (C-contiguous; on the CPU it shares memory when ``x`` already is), moved to ``device`` when given."""
    import torch

    if x is None:
        return None
    a = np.ascontiguousarray(x)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t if device is None else t.to(device)


def to_numpy(t) -> np.ndarray:
    """A torch tensor (any device) as a NumPy array of the same dtype (torch.bfloat16 as ml_dtypes bf16)."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def torch_dtype(name: str):
    """The torch dtype of an activation dtype name (``numerics.ACTIVATIONS``)."""
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
