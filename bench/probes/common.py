"""What the probes share: the decode shape of the registry's ``turboquant/decode`` bench at one
length, its inputs, CUDA-graph medians in ms, an ``--out DIR`` argument, and a time limit's SIGTERM
turned into ``Stopped`` and the rows measured before it saved (``measure_rows``), and ncu's metrics of one
launch or of every launch in a profiler range (``find_ncu``, ``ncu_metrics``, ``ncu_range``)."""
from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np


class Stopped(BaseException):
    """Raised in a probe by SIGTERM (``timeout``) after ``stop_on_term``: the probe prints what it measured."""


def _raise_stopped(signum, frame):
    raise Stopped()


def stop_on_term() -> None:
    """From now on, SIGTERM raises ``Stopped`` in this process."""
    signal.signal(signal.SIGTERM, _raise_stopped)


def measure_rows(path: Path, rows: list, measure) -> None:
    """Run ``measure(save)``, which appends to ``rows`` and calls ``save()`` (``rows`` as JSON to ``path``) as it
    goes; a SIGTERM (``timeout``) or a failure ends it with what was measured, printed whole, and ``rows``
    saved at the end whatever happened."""
    def save():
        path.write_text(json.dumps(rows, indent=1) + "\n")

    stop_on_term()   # a ``timeout`` still gets the table of what was measured
    try:
        measure(save)
    except Stopped:
        print("stopped by SIGTERM: the table holds what was measured before it", flush=True)
    except Exception:
        print(f"FAILED\n{traceback.format_exc()}", flush=True)
    save()


def find_ncu() -> str | None:
    """ncu on PATH, else CUDA's default install; None (and a line saying so) where neither has it."""
    exe = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu",) if Path(p).exists()), None)
    if exe is None:
        print("ncu: not found on PATH nor in /usr/local/cuda/bin", flush=True)
    return exe


def ncu_metrics(exe: str, kernel_regex: str, metrics, target: list, csv_path: Path, name: str,
                timeout: float) -> dict:
    """ncu's ``metrics`` of the third launch of a kernel matching ``kernel_regex`` in ``python -m *target``
    (``--clock-control none``): {metric name: (value, unit)}; ncu's CSV written to ``csv_path``; where it gave
    none, ncu's output printed under ``name`` and {} returned. A timeout raises ``subprocess.TimeoutExpired``."""
    rows = _ncu_rows([exe, "--clock-control", "none", "-k", f"regex:{kernel_regex}", "--launch-skip", "2",
                      "--launch-count", "1", "--csv", "--metrics", ",".join(metrics), sys.executable, "-m", *target],
                     csv_path, name, timeout)
    return {r["Metric Name"]: (r["Metric Value"], r["Metric Unit"]) for r in rows}


def ncu_range(exe: str, metrics, target: list, csv_path: Path, name: str, timeout: float) -> list:
    """ncu's ``metrics`` of every kernel ``python -m *target`` launches between ``cudaProfilerStart`` and
    ``cudaProfilerStop`` (``--profile-from-start off``, ``--clock-control none``), in launch order:
    [(kernel name, {metric name: (value, unit)})]; ncu's CSV written to ``csv_path``; where it gave none, ncu's
    output printed under ``name`` and [] returned. A timeout raises ``subprocess.TimeoutExpired``."""
    return ncu_kernels(_ncu_rows([exe, "--clock-control", "none", "--profile-from-start", "off", "--csv",
                                  "--metrics", ",".join(metrics), sys.executable, "-m", *target], csv_path, name,
                                 timeout))


def ncu_kernels(rows: list[dict]) -> list:
    """ncu's CSV rows (``ncu_csv_rows``) by kernel launch, in launch order: [(kernel name, {metric: (value,
    unit)})]."""
    kernels: dict = {}
    for r in rows:
        kernels.setdefault(int(r["ID"]), (r["Kernel Name"], {}))[1][r["Metric Name"]] = (r["Metric Value"],
                                                                                          r["Metric Unit"])
    return [kernels[i] for i in sorted(kernels)]


def ncu_csv_rows(text: str) -> list[dict]:
    """The rows of ncu's ``--csv`` output (one a kernel launch and metric; ncu's own lines left out)."""
    return list(csv.DictReader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln.startswith('"')))))


def _ncu_rows(argv: list, csv_path: Path, name: str, timeout: float) -> list[dict]:
    """``ncu_csv_rows`` of ncu's output for ``argv``, the whole output written to ``csv_path``."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    csv_path.write_text(p.stdout)
    rows = ncu_csv_rows(p.stdout)
    if not rows:
        print(f"ncu {name}: rc {p.returncode}, no metrics:", p.stdout[-1500:], p.stderr[-1500:], flush=True)
    return rows


def shape(L: int = 8192) -> dict:
    from bench import registry

    return registry.benches()["turboquant/decode"].shapes[f"L={L}"]


def graph_ms(fn) -> float:
    """Median ms of CUDA-graph replays of ``fn`` (bench.timing)."""
    from bench import timing

    return float(np.median(timing.cuda_graph(fn, 1))) * 1e3


def impl_ms(name: str, s: dict, inputs) -> float:
    """Median ms of the registry implementation (or ceiling) ``name`` at shape ``s``."""
    from bench import registry

    return graph_ms(registry.impls("turboquant/decode")[name].prepare(s, inputs))


def out_dir(description: str, argv=None) -> Path:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=".", help="folder for the JSON file")
    out = Path(ap.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {path}")
