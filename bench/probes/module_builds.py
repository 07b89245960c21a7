"""The C++ GDN module built from several source trees side by side (each tree's own CMakeLists, cmake and
ninja, all at once with the cores shared), for the probes that time one build against another."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def build_modules(sources: dict[str, Path], build_root: Path, cmake_args: str = "") -> dict[str, Path]:
    """name -> the module built from ``sources[name]`` in build_root/NAME (cleared first; ``cmake_args``
    added to each configure), its log in build_root/NAME.log. A failed build prints its log's tail and
    ends the probe (exit status 1)."""
    build_root.mkdir(parents=True, exist_ok=True)
    jobs = max(1, (os.cpu_count() or 2) // max(1, len(sources)))
    t0 = time.monotonic()
    procs = {}
    for name, src in sources.items():
        d = build_root / name
        shutil.rmtree(d, ignore_errors=True)
        cmd = (f"cmake -S {src} -B {d} -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_COPY_TO_SOURCE=OFF "
               f"-DPython_EXECUTABLE={sys.executable} {cmake_args} && ninja -C {d} -j {jobs}")
        with open(build_root / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT)
    failed = [name for name, p in procs.items() if p.wait() != 0]
    for name in failed:
        print(f"build {name} ({sources[name]}) failed:\n" + (build_root / f"{name}.log").read_text()[-3000:],
              file=sys.stderr)
    if failed:
        raise SystemExit(1)
    print(f"built {len(sources)} modules in {time.monotonic() - t0:.0f} s", flush=True)
    out = {}
    for name in sources:
        found = sorted((build_root / name).glob("_gdn*.so"))
        if not found:
            raise SystemExit(f"build {name}: no module (log: {build_root / name}.log)")
        out[name] = found[0]
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo)."""
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
