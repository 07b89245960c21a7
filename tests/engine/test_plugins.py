"""Backends, families and studies from another package, found through its entry points (no
environment variable, so ``--resume`` sees them too), and kernel-lab's pytest plugin running the
matrix over that package's backend from the package's own test suite. The package is built here
and pip-installed into a target folder put on PYTHONPATH."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BACKEND = '''
from conformance import families
from conformance.registry import Backend, register


def _run(cell, inputs):
    from reference.gdn import numpy_ref
    return families.get(cell.family).run_with(numpy_ref, cell, inputs)


register(Backend(name="mine", ops={"gdn": families.get("gdn").OPS}, available=lambda: (True, "always"),
                 run=_run, rounding_models={"gdn": "exact"}))
'''
STUDY = '''
NAME = "mine-study"
DESCRIPTION = "a study from another package"


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=3)


def check(args):
    if args.n < 1:
        raise ValueError(f"--n {args.n}: expected a positive count")


def run(args):
    return {"study": NAME, "n": args.n}


def summarize(result):
    return f"mine-study ran with n={result['n']}"
'''
PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mine-kernels"
version = "0.0.1"

[tool.setuptools]
py-modules = ["mine_backend", "mine_study"]

[project.entry-points."kernel_lab.backends"]
mine = "mine_backend"

[project.entry-points."kernel_lab.studies"]
mine-study = "mine_study"

[project.entry-points."kernel_lab.families"]
toy = "tests.engine.toy_family"
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The environment of a process that has mine-kernels installed (a target folder on PYTHONPATH)."""
    src = tmp_path_factory.mktemp("mine-src")
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "mine_backend.py").write_text(BACKEND)
    (src / "mine_study.py").write_text(STUDY)
    target = tmp_path_factory.mktemp("mine-target")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_LAB_")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}


def _lab(env, *args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "kernel_lab", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_entry_points_register_backends_families_and_studies(installed, tmp_path):
    doctor = _lab(installed, "doctor")
    assert doctor.returncode == 0 and "mine " in doctor.stdout and "always" in doctor.stdout
    assert "toy/scale" in _lab(installed, "list-cells", "--tier", "smoke", "--family", "toy").stdout
    study = _lab(installed, "study", "mine-study", "--n", "5", "--out", str(tmp_path / "s.json"))
    assert study.returncode == 0 and "n=5" in study.stdout
    out = tmp_path / "run"
    first = _lab(installed, "conform", "--tier", "smoke", "--family", "gdn", "--backend", "mine", "--out", str(out))
    assert first.returncode == 0, first.stderr
    again = _lab(installed, "conform", "--tier", "smoke", "--family", "gdn", "--backend", "mine", "--out", str(out),
                 "--resume")
    assert again.returncode == 0, again.stderr  # no variable to repeat: the entry point is installed
    # the variables still add modules for one call, beside the entry points
    toy = _lab({**installed, "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends"}, "doctor")
    assert "toy-good" in toy.stdout and "mine " in toy.stdout


def test_pytest_plugin_runs_the_matrix_over_another_packages_backend(installed, tmp_path):
    assert "kernel_lab" in {ep.name for ep in entry_points(group="pytest11")}, \
        "kernel-lab's pytest11 entry point is not installed: reinstall it (make extension)"
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_own.py").write_text("def test_own():\n    assert True\n")
    (project / "tests" / "test_kernels.py").write_text("from conformance.pytest_plugin import test_kernel_lab  # noqa\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kernel-lab-tier", "smoke",
                           "--kernel-lab-backend", "mine", "--kernel-lab-family", "gdn", "-rs"],
                          capture_output=True, text=True, timeout=600, env=installed, cwd=project)
    assert done.returncode == 0, done.stdout[-3000:]
    from conformance import families

    n = len(families.get("gdn").cells("smoke"))  # one test per cell, each passes (mine is the NumPy reference)
    assert n > 1 and done.stdout.splitlines()[-1].startswith(f"{n + 1} passed"), done.stdout[-2000:]
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kernel-lab-tier", "smoke",
                          "--kernel-lab-backend", "nope"], capture_output=True, text=True, timeout=300, env=installed,
                         cwd=project)
    assert bad.returncode == 4 and "--kernel-lab-backend: unknown nope" in bad.stderr + bad.stdout
