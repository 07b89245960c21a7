"""The machine fingerprint of a perf run, and its key: the folder of its saved runs under
``baselines/`` (CPU benches: the CPU model and usable cores; GPU benches: the GPU name)."""
from __future__ import annotations

import functools
import os
import re

from conformance import fingerprint as fp


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@functools.lru_cache(maxsize=None)
def fingerprint(device: str) -> dict:
    """{"key", "cpu": model, "cores", "flags", "gpu", "omp_wait_policy"} for benches on ``device``."""
    cpu = fp.cpu()
    gpus = fp.gpus() if device == "gpu" else []
    out = {"cpu": cpu["model"], "cores": cpu["usable_cores"], "flags": cpu["flags"],
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    if device == "gpu":
        gpu = gpus[0] if gpus else {}
        out["gpu"] = {k: gpu.get(k) for k in ("name", "compute_capability", "arch", "runtime", "driver")}
        name = (gpu.get("name") or "no-gpu").replace("NVIDIA ", "").replace("AMD ", "")
        out["key"] = _slug(name)
    else:
        out["key"] = f"{_slug(cpu['model'])}-{cpu['usable_cores']}cpu"
    return out


def has_cpu_flag(flag: str) -> bool:
    return flag in fp.cpu()["flags"]


def gpu_capability() -> tuple[bool, str]:
    """(a CUDA or ROCm GPU usable by torch and Triton, reason)."""
    return fp.triton_gpu()
