"""Every registered implementation and ceiling at every shape as one pytest-benchmark entry:
``extra_info`` is the registry's record (perf-JSON schema) from the session's interleaved
measurement, and pytest-benchmark's statistics are that measurement's repetitions (the entry is
made by one empty pedantic round whose sample is then replaced). Benches whose gates are not in
the default run are ``slow``."""
from __future__ import annotations

import pytest

from bench import gates, registry

from .conftest import all_records

DEFAULT_BENCHES = {b for g in gates.load() if g.quiet() for b in g.benches}


def _param(bench, shape, impl):
    device = registry.benches()[bench].device
    marks = [] if bench in DEFAULT_BENCHES and device == "cpu" else [pytest.mark.slow]
    if device == "gpu":
        marks.append(pytest.mark.gpu)
    return pytest.param(bench, shape, impl, id=f"{bench}/{shape}/{impl}", marks=marks)


@pytest.mark.parametrize("bench,shape,impl", [_param(*r) for r in all_records()])
def test_benchmark(bench, shape, impl, perf_session, benchmark):
    rec = perf_session.need(bench)[f"{bench}/{shape}/{impl}"]
    if rec.skip is not None:
        pytest.skip(rec.skip)
    benchmark.extra_info.update(rec.extra_info)
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.stats.stats.data = [float(t) for t in rec.samples]
