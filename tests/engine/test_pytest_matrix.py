"""The matrix in another project's pytest run behaves as pytest: a failing pair is the lab's one
paragraph, ``-k`` takes the ids, node ids, ``--lf`` and pytest-xdist work (toy family, in a child pytest)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ["--kernel-lab-tier", "smoke", "--kernel-lab-family", "toy", "--kernel-lab-backend", "toy-good,toy-wrong"]


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNEL_LAB_FAMILY_MODULES": "tests.engine.toy_family",
           "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *MATRIX, *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=project)


def test_the_matrix_fails_in_one_paragraph_and_selects_as_pytest_does(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_kernels.py").write_text("from conformance.pytest_plugin import test_kernel_lab  # noqa: F401\n")
    first = _pytest(tmp_path, "-p", "no:randomly")
    assert first.returncode == 1 and first.stdout.splitlines()[-1].startswith("3 failed, 3 passed"), first.stdout
    # each failure: its paragraph and pytest's header, no traceback of the lab's internals
    assert len(first.stdout.splitlines()) < 40, first.stdout
    para = next(line for line in first.stdout.splitlines() if line.startswith("fail: toy/scale/n=8/"))
    assert "margin" in para and "tolerance" in para and "repro: kernel-lab conform --tier smoke --filter" in para
    assert "Traceback" not in first.stdout and "conformance/" not in first.stdout
    # --lf reruns the failures only
    again = _pytest(tmp_path, "--lf")
    # only the 3 failures run again (a warning of the environment may join the count: "3 failed, 1 warning in")
    assert re.match(r"3 failed(, \d+ warnings?)? in", again.stdout.splitlines()[-1]), again.stdout
    # -k on the words of an id, and a node id passed back
    picked = _pytest(tmp_path, "-k", "n:9 and toy-wrong", "--co")
    (node,) = [line for line in picked.stdout.splitlines() if "::" in line]
    assert node.endswith("[toy/scale/n:9/factor:2.0/seed:0/backend:toy-wrong]"), node
    one = _pytest(tmp_path, node)
    assert one.stdout.splitlines()[-1].startswith("1 failed"), one.stdout
    # pytest-xdist splits the matrix
    split = _pytest(tmp_path, "-n", "2", "-p", "no:cacheprovider")
    assert split.stdout.splitlines()[-1].startswith("3 failed, 3 passed"), split.stdout
