"""Capture a layer's tensors into a file that ``kernel-lab conform --inputs FILE`` runs: from NumPy
arrays or torch tensors (``save``), or from the arguments a torch module is called with
(``capture_call``: a forward pre-hook). Keys are the reference's argument names (gdn decode: q, k,
v, A_log, a, b, dt_bias, state, state_indices; turboquant decode: query, kv_cache, block_table,
seq_lens, rotation, sinks). torch.bfloat16 is kept (as ml_dtypes bfloat16), every other dtype too.

    handle = capture_call(layer, "gdn-decode.safetensors",
                          keys={"q": "query", "k": "key", "v": "value", "A_log": "A_log", "a": "a",
                                "b": "b", "dt_bias": "dt_bias", "state": "ssm_state",
                                "state_indices": "state_indices"})
    model(batch)        # the first call of layer writes the file, then the hook removes itself
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from conformance.inputs import tensor_files


def as_array(name: str, value: Any) -> np.ndarray:
    """A NumPy array or a torch tensor (any device, detached) as a NumPy array of the same dtype;
    TypeError naming ``name`` for anything else."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        from conformance.torch_arrays import to_numpy

        return to_numpy(value)
    raise TypeError(f"{name}: expected a NumPy array or a torch tensor, got {type(value).__name__}")


def save(path: str | os.PathLike, tensors: Mapping[str, Any], strings: Mapping[str, str] | None = None) -> Path:
    """Write ``tensors`` (name -> NumPy array or torch tensor) and ``strings`` (e.g. turboquant's
    preset, layout) to ``path``, a ``.npz`` or ``.safetensors`` file."""
    return tensor_files.write(path, {name: as_array(name, t) for name, t in tensors.items()}, strings)


def _resolve(module, bound: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for key, source in keys.items():
        if source in bound:
            out[key] = bound[source]
        elif hasattr(module, source):
            out[key] = getattr(module, source)
        else:
            raise ValueError(f"keys: {key} -> {source!r} is neither an argument of {type(module).__name__}.forward "
                             f"({', '.join(bound)}) nor an attribute of the module")
    return out


def capture_call(module, path: str | os.PathLike, keys: Mapping[str, str] | Sequence[str] | None = None,
                 strings: Mapping[str, str] | None = None,
                 when: Callable[[dict], bool] | None = None):
    """Save the tensors ``module`` (a torch.nn.Module) is called with to ``path``, on the first call
    for which ``when(arguments)`` holds (default: the first call), then remove the hook. Returns the
    hook's handle (``handle.remove()`` if the call never comes).

    ``keys``: file key -> the name of an argument of ``module.forward`` (bound by its signature) or
    of an attribute of the module (a parameter such as A_log); a sequence means the same names; None:
    every tensor argument under its own name. A forward pre-hook, so the tensors are those before the
    call: a decode updates its state pool in place."""
    forward = inspect.signature(module.forward)
    names = {k: k for k in keys} if keys is not None and not isinstance(keys, Mapping) else keys
    handle = None

    def hook(mod, args, kwargs):
        bound = forward.bind(*args, **kwargs).arguments
        if when is not None and not when(dict(bound)):
            return None
        if names is None:
            tensors = {k: v for k, v in bound.items() if hasattr(v, "shape") and hasattr(v, "dtype")}
        else:
            tensors = _resolve(mod, bound, names)
        save(path, tensors, strings)
        handle.remove()
        return None

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    return handle
