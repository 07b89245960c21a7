"""Shared pytest setup: the --tier option of the conformance matrix, and the Triton interpreter on
machines without a GPU (it must be chosen before triton.jit runs, so it is decided here)."""
import os
from pathlib import Path

from conformance.families import TIERS


def _has_gpu() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd"))


if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The JAX reference runs on the CPU (its backend declares JAX_PLATFORMS=cpu; see reference_backends).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def pytest_addoption(parser):
    parser.addoption("--tier", default=os.environ.get("KERNEL_LAB_TIER", "ci"), choices=TIERS,
                     help="conformance tier the matrix tests run (default ci, or $KERNEL_LAB_TIER)")
    parser.addoption("--cells", default=None, metavar="REGEX",
                     help="matrix tests only for cell ids matching REGEX (as `kernel-lab conform --filter`; "
                          "-k cannot hold the '=' of an id)")
