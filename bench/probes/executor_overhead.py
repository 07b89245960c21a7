"""The ray executor's cost against the local pool on one machine: the same selection run by
``conform --executor local`` (one worker), ``--executor ray`` on a running single-node cluster
(one CPU slot; the cluster started beforehand, as a lab's would be) and ``--executor ray
--address local`` (Ray started and stopped by the run), alternating, ``--repeat`` times each.
Wall time of the whole command and run.json's ``elapsed_s``; the records of every run must equal
the first local run's in keys and statuses. Writes ``executor_overhead.json``.

    python -m bench.probes.executor_overhead --tier ci --backend numpy-ref --repeat 2 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance import fingerprint
from conformance.run import records

ROOT = Path(__file__).resolve().parents[2]


def conform(args: list[str], out: Path) -> dict:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "conform", *args, "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode not in (0, 1) or not (out / "run.json").exists():
        raise SystemExit(f"conform {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()[-2000:]}")
    info = json.loads((out / "run.json").read_text())
    keyed = {f"{r['id']} {r['backend']}": r["status"] for r in records.read(out / "cells.jsonl")}
    return {"wall_s": round(wall, 2), "elapsed_s": info["elapsed_s"], "statuses": keyed}


def summary(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"wall_s": walls, "wall_min_s": min(walls), "wall_median_s": statistics.median(walls),
            "elapsed_s": [r["elapsed_s"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tier", default="ci")
    p.add_argument("--backend", default="numpy-ref")
    p.add_argument("--family")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", required=True, help="folder for executor_overhead.json")
    a = p.parse_args(argv)
    from ray.cluster_utils import Cluster

    sel = ["--tier", a.tier, "--backend", a.backend, *(["--family", a.family] if a.family else [])]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
                                                              "object_store_memory": 100 << 20})
    runs: dict[str, list[dict]] = {"local": [], "ray": [], "ray_address_local": []}
    variants = {"local": ["--executor", "local", "--jobs", "1"],
                "ray": ["--executor", "ray", "--address", cluster.address],
                "ray_address_local": ["--executor", "ray", "--address", "local"]}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(a.repeat):
                for name, extra in variants.items():
                    runs[name].append(conform(sel + extra, Path(tmp) / f"{name}-{i}"))
                    print(f"{name} {i}: {runs[name][-1]['wall_s']} s", flush=True)
    finally:
        cluster.shutdown()
    want = runs["local"][0]["statuses"]
    same = all(r["statuses"] == want for rs in runs.values() for r in rs)
    git = fingerprint.git_commit()
    result = {"commit": git["commit"], "dirty": git["dirty"], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "cpu": fingerprint.cpu(), "selection": sel, "pairs": len(want),
              "statuses": {s: list(want.values()).count(s) for s in sorted(set(want.values()))},
              "records_equal_in_keys_and_statuses": same, "command": "python -m bench.probes.executor_overhead "
              + " ".join(sys.argv[1:] if argv is None else argv),
              **{name: summary(rs) for name, rs in runs.items()}}
    base = result["local"]["wall_min_s"]
    result["overhead_min_s"] = {n: round(result[n]["wall_min_s"] - base, 2) for n in ("ray", "ray_address_local")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "executor_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("cpu",)}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
