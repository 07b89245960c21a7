"""The code path a backend takes, recorded with every record as ``path``: what ran, or for a skip
what would have run.

Names: ``amx``, ``avx512``, ``scalar`` (the ISA build of the C++ kernels that the extension says it
dispatched to); a GPU's architecture (``sm_90``, ``gfx950``: ``gpu`` where no GPU is visible, so
the architecture is unknown); ``interpreter`` (the Triton interpreter on the CPU); ``gfx950-emulated``
(the NumPy emulation of the FlyDSL kernel); ``numpy``, ``jax`` (the references); ``cpu`` (torch or a
peer's own CPU code). A backend declares its path with ``Backend.path``; one that chooses at run
time reports what it took with ``took`` while it runs, and that is what its record holds (several
paths of one run joined with ``+``; ``none dispatched``: a C++ backend's run that called no kernel).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

NO_GPU = "gpu"
UNKNOWN = "unknown"

_taken: list[str] | None = None


@functools.cache
def gpu_arch() -> str | None:
    """This process's GPU 0 as its architecture: ``sm_XY`` from torch.cuda.get_device_capability,
    or the gfx name on ROCm; None without torch or a visible GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):
        return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def on_gpu(cell=None) -> str:
    """The path of a GPU backend: the device's architecture, ``gpu`` where none is visible."""
    return gpu_arch() or NO_GPU


def fixed(name: str):
    """A ``Backend.path`` that is always ``name``."""
    return lambda cell=None: name


def took(path: str) -> None:
    """Say which path the running backend took (inside ``observe``; elsewhere ignored)."""
    if _taken is not None:
        _taken.append(path)


@contextmanager
def observe():
    """Collect what ``took`` is told while the block runs: the paths, in order (repeats dropped)."""
    global _taken
    outer, _taken = _taken, []
    seen = _taken
    try:
        yield seen
    finally:
        seen[:] = list(dict.fromkeys(seen))
        _taken = outer
