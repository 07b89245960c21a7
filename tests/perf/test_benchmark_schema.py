"""The perf JSON that ``kernel-lab bench --out`` writes is pytest-benchmark's full schema:
pytest-benchmark's own ``compare`` (a table and ``--histogram``) reads it, and its statistics are
the ones pytest-benchmark computes from the samples."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import run
from bench.measure import Record

pytest.importorskip("pygal", reason="pytest-benchmark's --histogram needs pygal (`make setup` installs it)")

BENCH = [sys.executable, "-c", "import sys; from pytest_benchmark.cli import main; sys.exit(main())"]


def _records(scale: float) -> dict[str, Record]:
    rng = np.random.default_rng(0)
    out = {}
    for impl in ("cpu", "torch-eager"):
        rid = f"gdn/decode/state=float32/{impl}"
        samples = scale * (1e-3 + 1e-4 * rng.random(15))
        t = {"min": float(samples.min()), "median": float(np.median(samples)), "max": float(samples.max()),
             "n": len(samples)}
        out[rid] = Record(rid, {"bench": "gdn/decode", "impl": impl, "role": "ours", "shape": {"N": 8},
                                "time_s": t, "timing": "cpu-interleaved"}, samples=samples)
    out["gdn/decode/state=float32/absent"] = Record("gdn/decode/state=float32/absent", {}, skip="not here")
    return out


def test_bench_json_is_read_by_pytest_benchmark_compare_and_histogram(tmp_path):
    old, new = tmp_path / "old" / "perf.json", tmp_path / "new" / "perf.json"
    run.write(old, run.perf_json(_records(1.0), []))
    run.write(new, run.perf_json(_records(1.3), []))
    data = json.loads(new.read_text())
    assert {"machine_info", "commit_info", "datetime", "version", "benchmarks"} <= set(data)
    stats = data["benchmarks"][0]["stats"]
    for key in ("data", "min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "ops", "rounds",
                "iqr_outliers", "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "total", "iterations"):
        assert key in stats, key
    samples = _records(1.3)["gdn/decode/state=float32/cpu"].samples
    assert stats["data"] == pytest.approx(list(samples))
    assert stats["median"] == pytest.approx(np.median(samples)) and stats["ops"] == pytest.approx(1 / np.mean(samples))
    done = subprocess.run([*BENCH, "compare", str(old), str(new), "--histogram", str(tmp_path / "hist")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gdn/decode/state=float32/cpu" in done.stdout and "IQR" in done.stdout
    assert [p.suffix for p in tmp_path.glob("hist*")] == [".svg"]
    svg = next(tmp_path.glob("hist*")).read_text()
    assert "<svg" in svg and "state=float32/cpu" in svg


@pytest.mark.slow
def test_pytest_path_json_is_read_by_compare_and_histogram(tmp_path):
    """The same through pytest (``make perf``'s path), on the float32 decode rows (about 40 s)."""
    out = tmp_path / "perf.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/perf/test_benchmarks.py",
                           "-k", "gdn/decode and float32", f"--benchmark-json={out}"],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-2000:]
    done = subprocess.run([*BENCH, "compare", str(out), "--histogram", str(tmp_path / "hist")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gdn/decode/state=float32/cpu" in done.stdout and (tmp_path / "hist.svg").exists()
