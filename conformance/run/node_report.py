"""What a machine says about itself before it runs pairs for a driver: its identity (kernel-lab
version, git commit, C++ extension build), its device class, its fingerprint and each backend's
availability as probed there.

A device class names one kind of hardware whose records belong in one run folder: ``h200`` or
``mi300x`` (the GPU's model, lower case), else ``cpu-amx``, ``cpu-avx512`` or ``cpu``. The
environment variable ``KERNEL_LAB_DEVICE_CLASS`` on a machine overrides the derived name.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

from conformance import fingerprint, registry
from conformance.run import probe

CLASS_ENV = "KERNEL_LAB_DEVICE_CLASS"


def extension_build() -> str | None:
    """The first 16 hex digits of the SHA-256 of the built C++ extension (None: not built)."""
    try:
        spec = importlib.util.find_spec("optimized.cpu._gdn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def identity() -> dict:
    """kernel-lab's version, git commit (and whether the tree is dirty) and C++ build id here."""
    try:
        version = importlib.metadata.version("kernel-lab")
    except importlib.metadata.PackageNotFoundError:
        version = None
    git = fingerprint.git_commit()
    return {"version": version, "commit": git["commit"], "dirty": git["dirty"], "cpp_build": extension_build()}


def identity_differences(driver: dict, node: dict) -> list[str]:
    """``commit abc, driver def`` for each identity field in which ``node`` differs from ``driver``."""
    names = {"version": "kernel-lab", "commit": "commit", "dirty": "dirty tree", "cpp_build": "C++ build"}
    return [f"{names[k]} {node.get(k)}, driver {driver.get(k)}" for k in names if node.get(k) != driver.get(k)]


def device_class(fp: dict, override: str | None = None) -> str:
    """The device class of a machine with fingerprint ``fp`` (``override`` wins when given)."""
    if override:
        return override
    if fp.get("gpus"):
        words = re.findall(r"[a-z0-9]+", fp["gpus"][0]["name"].lower())
        return words[-1] if words else "gpu"
    flags = set(fp.get("cpu", {}).get("flags", ()))
    if "amx_bf16" in flags:
        return "cpu-amx"
    if "avx512f" in flags:
        return "cpu-avx512"
    return "cpu"


def local_device_class() -> str:
    """This machine's device class (``KERNEL_LAB_DEVICE_CLASS`` if set)."""
    return device_class(fingerprint.fingerprint(), os.environ.get(CLASS_ENV))


def probes(backend_names: list[str]) -> dict[str, list]:
    """``[available, why]`` of each named backend in this process (a name not registered here is unavailable)."""
    known = registry.backends()
    return {name: list(probe.probe(known[name])) if name in known else [False, "not registered on this node"]
            for name in backend_names}


def report(backend_names: list[str]) -> dict:
    """This process's identity, fingerprint, device class and probes of ``backend_names``."""
    fp = fingerprint.fingerprint()
    return {"identity": identity(), "fingerprint": fp, "device_class": device_class(fp, os.environ.get(CLASS_ENV)),
            "probes": probes(backend_names)}
