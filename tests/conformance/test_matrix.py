"""The conformance matrix as pytest parameters: one test per (cell, backend) of the --tier,
judged by the same family check and tolerances as `kernel-lab conform` (run in-process here;
the runner isolates crashes in worker processes). Ids are the plugin's (`conformance.pytest_plugin`:
`=` written `:`, the backend last), so `-k "gdn and chunked and act:bfloat16 and cpu-avx512"` selects,
and --cells REGEX matches the whole cell id."""
import pytest

from conformance.pytest_plugin import check_pair, params
from conformance.run import estimate

SLOW_S = 30.0
LONG_S = 0.5


def _marks(cell, backend):
    # vLLM's kernels take minutes a cell in the interpreter: the default run has a named subset
    # (tests/unit/test_vllm_peers.py), `make conform BUDGET=` all of them; so do the cells an
    # interpreter backend expects past SLOW_S (its first estimate). A pair expected past LONG_S is `long`
    # (the ci tier's 431 such pairs took 789 s beside another worker on a 2-core Zen EPYC, 2026-12-07, most of
    # it JAX compiles and interpreter runs; its other 546 pairs 142 s): `make test` runs the cheap pairs,
    # `make test-long` (and CI) the rest
    interp = "TRITON_INTERPRET" in backend.env
    expected = estimate.first_estimate(cell, backend)
    if interp and (backend.name.startswith("vllm-") or expected > SLOW_S):
        return [pytest.mark.slow]
    return [pytest.mark.long] if expected > LONG_S else []


def pytest_generate_tests(metafunc):
    if "cell" in metafunc.fixturenames:
        config = metafunc.config
        metafunc.parametrize("cell,backend_name", params(config.getoption("--tier"),
                                                         pattern=config.getoption("--cells"), marks=_marks))


def test_cell(cell, backend_name, request):
    check_pair(cell, backend_name, request.config.getoption("--tier"))
