"""The README's "Adding a backend" example, extracted and registered as written, runs through
``kernel-lab conform`` (over a stand-in ``my_kernels``: the NumPy reference), so it cannot drift."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conformance.run import records

ROOT = Path(__file__).resolve().parents[2]


def _backend_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Adding a backend"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_backend_example_registers_and_passes_the_smoke_tier(tmp_path):
    (tmp_path / "readme_backend.py").write_text(_backend_example())
    (tmp_path / "my_kernels.py").write_text("from reference.turboquant.numpy_ref import decode, store  # noqa\n"
                                            "__version__ = 'stand-in'\n")
    env = {**os.environ, "KERNEL_LAB_BACKEND_MODULES": "readme_backend",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "conform", "--family", "turboquant", "--tier", "smoke",
                          "--backend", "my-backend", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr + res.stdout
    recs = records.read(out / "cells.jsonl")
    assert {r["status"] for r in recs} == {"pass", "skip"}
    assert any(r["status"] == "pass" and r["op"] == "decode" for r in recs)
    assert all(r["rounding_model"] == "exact" for r in recs)
    assert "only the SoA layout" in {r["reason"] for r in recs if r["status"] == "skip"}
    assert json.loads((out / "run.json").read_text())["backends"]["my-backend"]["available"]
