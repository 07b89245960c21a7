"""The conformance matrix as pytest parameters: one test per (cell, backend) of the --tier,
judged by the same family check and tolerances as `kernel-lab conform` (run in-process here;
the runner isolates crashes in worker processes). Select with -k on words of the id
(`-k "gdn and chunked and bfloat16 and cpu-avx512"`) or with --cells REGEX on the whole id."""
import re

import pytest

from conformance import families, registry
from conformance.pytest_plugin import check_pair
from conformance.run import estimate

SLOW_S = 30.0


def pytest_generate_tests(metafunc):
    if "cell" not in metafunc.fixturenames:
        return
    tier = metafunc.config.getoption("--tier")
    pattern = metafunc.config.getoption("--cells")
    wanted = re.compile(pattern) if pattern else None
    params, ids = [], []
    for fam in families.families().values():
        for cell in fam.cells(tier):
            if wanted is not None and not wanted.search(cell.id):
                continue
            for name, backend in registry.backends().items():
                if cell.family in backend.ops:
                    # vLLM's kernels take minutes a cell in the interpreter: the default run has a named
                    # subset (tests/unit/test_vllm_peers.py), `make conform` all of them; so do the cells an
                    # interpreter backend expects past SLOW_S (its first estimate: `make conform` runs them)
                    interp = "TRITON_INTERPRET" in backend.env
                    slow = interp and (name.startswith("vllm-") or estimate.first_estimate(cell, backend) > SLOW_S)
                    params.append(pytest.param(cell, name, marks=[pytest.mark.slow] if slow else []))
                    ids.append(f"{cell.id}@{name}")
    metafunc.parametrize("cell,backend_name", params, ids=ids)


def test_cell(cell, backend_name):
    check_pair(cell, backend_name)
