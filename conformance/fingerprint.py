"""The hardware and software fingerprint written to run.json and shown by `kernel-lab doctor`."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")
PACKAGES = ("numpy", "ml_dtypes", "scipy", "jax", "jaxlib", "torch", "triton", "flydsl", "nanobind",
            "scikit-build-core", "pytest", "pytest-benchmark")


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
    """The command as the user typed it: `python -m conformance` runs as conformance/__main__.py."""
    name = Path(sys.argv[0]).name
    return "kernel-lab" if name in ("__main__.py", "kernel-lab") else name
