"""What an installed kernel-lab needs: pyproject declares each command's dependencies (extras where
optional) and a Python with tomllib; a command whose extra is missing says so in one line; the
gates file ships inside the package; saved runs and the measurement ledger stay outside every package,
and saved runs are read from and written to a chosen folder."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from bench import baselines, gates

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_pyproject_declares_what_each_command_imports():
    assert PROJECT["requires-python"] == ">=3.11"
    extras = {k: {d.split("[")[0].lower() for d in v} for k, v in PROJECT["optional-dependencies"].items()}
    assert {"jinja2", "matplotlib"} <= extras["report"] and "pytest-benchmark" in extras["bench"]
    assert {"pytest", "playwright", "junitparser", "pygal", "pygaljs"} <= extras["test"]
    assert PROJECT["entry-points"]["pytest11"] == {"kernel_lab": "conformance.pytest_plugin"}


def test_the_gates_file_is_inside_a_package():
    assert gates.GATES_TOML.parent == Path(gates.__file__).parent and gates.GATES_TOML.is_file()


def test_saved_runs_and_the_ledger_are_not_in_a_package():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]["wheel"]["packages"]
    assert (ROOT / "baselines").is_dir() and (ROOT / "ledger").is_dir()
    assert {"baselines", "ledger"}.isdisjoint(packages)
    out = ROOT / "reports" / "out"   # the commands' output folder (ignored by git, never packaged data)
    records = [p for pkg in packages for p in (ROOT / pkg).rglob("*")
               if (p.suffix == ".jsonl" or p.name == "baselines") and out not in p.parents]
    assert records == [], records


def test_a_missing_extra_is_one_line_naming_it(tmp_path):
    """jinja2 hidden (a module of that name that is not there): report says which extra installs it."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass _Hide:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name in ('jinja2', 'pytest_benchmark'):\n            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = tmp_path / "run"
    run.mkdir()
    done = subprocess.run([sys.executable, "-m", "kernel_lab", "report", str(run)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "kernel-lab: error: kernel-lab report needs jinja2, not installed here: pip install 'kernel-lab[report]'"]
    done = subprocess.run([sys.executable, "-m", "kernel_lab", "bench", "--bench", "gdn/decode"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2 and "pip install 'kernel-lab[bench]'" in done.stderr and "Traceback" not in done.stderr


def test_saved_runs_are_read_and_written_where_asked(tmp_path, monkeypatch):
    monkeypatch.setenv(baselines.VARIABLE, str(tmp_path / "mine"))
    assert baselines.root() == tmp_path / "mine"
    rid = "gdn/decode/state=float32/cpu"
    written = baselines.save("some-machine", {"benchmarks": [{"name": rid, "extra_info": {"x": 1}}]})
    assert written == tmp_path / "mine" / "some-machine" and baselines.saved("some-machine") == {rid: {"x": 1}}
    other = baselines.save("some-machine", {"benchmarks": []}, base=tmp_path / "elsewhere")
    assert other == tmp_path / "elsewhere" / "some-machine"
    monkeypatch.delenv(baselines.VARIABLE)
    monkeypatch.chdir(tmp_path)
    assert baselines.root() == Path("baselines") and baselines.save("m", {"benchmarks": []}) == Path("baselines/m")
    assert (tmp_path / "baselines" / "m" / "perf.json").is_file()
