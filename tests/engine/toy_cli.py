"""``kernel-lab`` in a child process with the toy family and backends (a clean registry: nothing that
other tests registered in this worker plays a part)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOY = {"KERNEL_LAB_FAMILY_MODULES": "tests.engine.toy_family", "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends"}


def lab(*args, cwd=ROOT, **kw) -> subprocess.CompletedProcess:
    """``kernel-lab ARGS`` (each turned into a string) with the toy family and backends; output captured."""
    env = {**os.environ, **TOY, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kernel_lab", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300, **kw)
