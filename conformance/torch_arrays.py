"""NumPy <-> torch for the backends, keeping the dtype: an ml_dtypes bfloat16 array becomes a torch
bfloat16 tensor (same bits) and back; every other dtype goes through ``torch.from_numpy``. Nothing
is converted to another dtype here: a backend that needs one says so where it converts."""
from __future__ import annotations

import ml_dtypes
import numpy as np


def to_torch(x, device=None):
    """``x`` (a NumPy array, or None) as a torch tensor of the same dtype on ``device`` (None: the CPU)."""
    import torch

    if x is None:
        return None
    a = np.ascontiguousarray(x)
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype.name == "bfloat16" else torch.from_numpy(a)
    return t if device is None else t.to(device)


def to_numpy(t) -> np.ndarray:
    """A torch tensor as a NumPy array of the same dtype (torch bfloat16 -> ml_dtypes bfloat16), on the host."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def torch_dtype(name: str):
    """The torch dtype of an activation dtype name (``numerics.ACTIVATIONS``)."""
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
