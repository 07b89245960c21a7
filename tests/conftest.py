"""Shared pytest setup: the --tier option of the conformance matrix, the Triton interpreter on
machines without a GPU (it must be chosen before triton.jit runs, so it is decided here), and the
`long` marker on the tests listed in tests/long_tests.txt."""
import os
from pathlib import Path

import pytest

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
                          "-k takes the test ids, where '=' is written ':')")


LONG_TESTS = Path(__file__).with_name("long_tests.txt")


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark `long` every test whose node id tests/long_tests.txt lists (measured 6 s or more)."""
    lines = (line.strip() for line in LONG_TESTS.read_text().splitlines())
    long_ids = {line for line in lines if line and not line.startswith("#")}
    for item in items:
        if item.nodeid in long_ids:
            item.add_marker(pytest.mark.long)
