"""The perf session: each bench of the registry is measured once (interleaved, all its shapes and
implementations and ceilings in the same run) the first time a test needs it; gate results are
collected, printed as one table at the end, added to the pytest-benchmark JSON as
``kernel_lab_gates`` and written alone to ``gates.json`` beside it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # torch's OpenMP threads sleep when idle

from bench import gates, measure, registry  # noqa: E402

GATE_RESULTS: list[dict] = []


class Session:
    """Records per bench, measured on first use; ``remeasure`` replaces them (``bench.run``)."""

    def __init__(self):
        self.records: dict[str, measure.Record] = {}
        self.measured: set[str] = set()

    def need(self, *benches: str) -> dict[str, measure.Record]:
        for bench in benches:
            if bench not in self.measured:
                self.measured.add(bench)
                self.records.update({r.rid: r for r in measure.measure(bench)})
        return self.records


@pytest.fixture(scope="session")
def perf_session() -> Session:
    return Session()


def pytest_terminal_summary(terminalreporter):
    if GATE_RESULTS:
        terminalreporter.write_sep("=", "perf gates")
        terminalreporter.write_line(gates.table(GATE_RESULTS))


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["kernel_lab_gates"] = GATE_RESULTS
    path = config.getoption("benchmark_json", None)
    if path is not None:
        Path(path).parent.joinpath("gates.json").write_text(json.dumps(GATE_RESULTS, indent=1) + "\n")


def all_records() -> list[tuple[str, str, str]]:
    """(bench, shape, impl) of every registered implementation, for parametrizing."""
    return [(b, s, i) for b, bench in registry.benches().items() for s in bench.shapes for i in registry.impls(b)]
