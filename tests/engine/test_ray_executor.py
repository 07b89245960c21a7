"""`conform --executor ray` on a real Ray cluster of this machine (``ray.cluster_utils.Cluster``:
a head without CPUs or GPUs, where the driver attaches, and worker nodes with logical GPUs), the
toy family and backends: Ray's device ids, placement by per-node probes, a node removed mid-run,
a segfaulting backend run once per pair, the driver killed and the run finished locally.

The cluster is this module's; each test adds the nodes it needs and removes them after."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conformance.run import records
from tests.engine.test_runner import ENV, ROOT, kl, statuses

ray = pytest.importorskip("ray", reason="Ray is not installed (make setup installs it)")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.ray
SMALL = {"object_store_memory": 80 << 20}
CI = ["conform", "--family", "toy", "--tier", "ci"]


@pytest.fixture(scope="module")
def cluster():
    # Worker processes of every node inherit these: the toy family and backends, the repository.
    names = ("KERNEL_LAB_FAMILY_MODULES", "KERNEL_LAB_BACKEND_MODULES", "PYTHONPATH")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: ENV[k] for k in names})
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "include_dashboard": False, **SMALL,
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}})
    try:
        yield c
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def nodes(cluster):
    """add(**resources) adds a worker node; every node added is removed after the test."""
    added = []

    def add(**args):
        node = cluster.add_node(**SMALL, **args)
        added.append(node)
        return node

    yield add
    for node in added:
        if node in cluster.worker_nodes:
            cluster.remove_node(node)


def ray_kl(cluster, *args, env=None):
    return subprocess.run([sys.executable, "-m", "kernel_lab", *args, "--executor", "ray", "--address",
                           cluster.address], cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=300)


def ray_popen(cluster, *args):
    return subprocess.Popen([sys.executable, "-m", "kernel_lab", *args, "--executor", "ray", "--address",
                             cluster.address], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def recs(out):
    return records.read(Path(out) / "cells.jsonl")


def wait_for_records(path: Path, n: int, proc, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path}: fewer than {n} records (driver status {proc.poll()})")


def test_logical_gpus_carry_rays_device_ids_and_equal_a_local_run(cluster, nodes, tmp_path):
    nodes(num_cpus=1, num_gpus=2)
    sel = [*CI, "--backend", "toy-gpu,toy-good,toy-wrong,toy-absent"]
    res = ray_kl(cluster, *sel, "--out", str(tmp_path / "ray"))
    assert res.returncode == 1, res.stderr
    got = recs(tmp_path / "ray")
    assert {r["device"] for r in got if r["backend"] == "toy-gpu"} == {"cuda:0", "cuda:1"}
    assert {r["device"] for r in got if r["backend"] in ("toy-good", "toy-wrong")} == {"cpu"}
    kl(*sel, "--out", str(tmp_path / "local"), "--jobs", "2", check_rc=1)
    assert statuses(tmp_path / "ray") == statuses(tmp_path / "local")
    info = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert info["executor"] == "ray" and len(info["slots"]) == 3 and len(info["nodes"]) == 1
    assert info["ray"] == ray.__version__ and info["retired_devices"] == {} and info["duplicates_dropped"] == 0


def test_placement_follows_each_nodes_probes(cluster, nodes, tmp_path):
    nodes(num_cpus=0, num_gpus=1)
    nodes(num_cpus=1, num_gpus=0, env_vars={"TOY_FEATURE": "1"})
    res = ray_kl(cluster, "conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-feature,toy-gpu",
                 "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    slots = {name: node["slots"] for name, node in info["nodes"].items()}
    (cpu_node,) = [n for n, s in slots.items() if s == ["cpu"]]
    (gpu_node,) = [n for n, s in slots.items() if s == ["cuda:0"]]
    got = recs(tmp_path / "o")
    assert {(r["backend"], r["status"], r["node"], r["device"]) for r in got} == {
        ("toy-feature", "pass", cpu_node, "cpu"), ("toy-gpu", "pass", gpu_node, "cuda:0")}
    assert info["backends"]["toy-feature"]["reason"] == f"on {cpu_node}"


def test_a_node_removed_mid_run_has_its_pairs_retried_once_and_the_run_is_complete(cluster, nodes, tmp_path):
    nodes(num_cpus=0, num_gpus=1)
    doomed = nodes(num_cpus=0, num_gpus=1)
    out = tmp_path / "o"
    proc = ray_popen(cluster, *CI, "--backend", "toy-gpu-slow", "--out", str(out))
    try:
        wait_for_records(out / "cells.jsonl", 3, proc)
        cluster.remove_node(doomed)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    got = recs(out)
    assert len(got) == 12 and len({records.key(r) for r in got}) == 12
    assert {r["status"] for r in got} == {"pass"}
    info = json.loads((out / "run.json").read_text())
    (lost,) = info["retired_devices"]
    retried = [r for r in got if "retried_from" in r]
    assert len(retried) == 1 and retried[0]["retried_from"] == lost and not lost.startswith(retried[0]["node"] + "/")
    assert f"warning: slot {lost} retired" in err


def test_a_segfaulting_backend_runs_once_per_pair_and_its_slots_survive(cluster, nodes, tmp_path):
    nodes(num_cpus=0, num_gpus=2)
    counter = tmp_path / "executions"
    res = ray_kl(cluster, "conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-gpu-segv",
                 "--out", str(tmp_path / "o"), env={"KERNEL_LAB_TOY_COUNTER": str(counter)})
    assert res.returncode == 1, res.stderr
    got = recs(tmp_path / "o")
    assert len(got) == 3 and all(r["status"] == "crash" and "SIGSEGV" in r["reason"] for r in got)
    assert Counter(counter.read_text().splitlines()) == {r["id"]: 1 for r in got}   # Ray retried nothing
    assert json.loads((tmp_path / "o" / "run.json").read_text())["retired_devices"] == {}


def test_the_driver_killed_mid_run_is_finished_by_resume_on_the_local_executor(cluster, nodes, tmp_path):
    nodes(num_cpus=1, num_gpus=2)
    out = tmp_path / "o"
    sel = [*CI, "--backend", "toy-gpu-slow,toy-good"]
    proc = ray_popen(cluster, *sel, "--out", str(out))
    try:
        wait_for_records(out / "cells.jsonl", 4, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    before = recs(out)
    assert 4 <= len(before) < 24
    res = kl(*sel, "--out", str(out), "--resume", "--executor", "local", "--jobs", "2")
    assert res.returncode == 0, res.stderr
    got = recs(out)
    assert len(got) == 24 and len({records.key(r) for r in got}) == 24 and got[:len(before)] == before
    assert {r["status"] for r in got} == {"pass"}
    assert "stale lock" in res.stderr


def _processes() -> dict[int, str]:
    """pid -> command line of every process of this machine."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                pass
    return out


def test_the_only_slot_killed_leaves_the_pairs_never_started_unrecorded_and_resume_runs_them(cluster, nodes,
                                                                                               tmp_path):
    nodes(num_cpus=0, num_gpus=1)   # one slot: its actor killed, no slot is left
    out = tmp_path / "o"
    sel = [*CI, "--backend", "toy-gpu-slow"]
    proc = ray_popen(cluster, *sel, "--out", str(out))
    try:
        wait_for_records(out / "cells.jsonl", 2, proc)
        (actor,) = [pid for pid, cmd in _processes().items() if cmd.startswith("ray::_Slot")]
        os.kill(actor, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    before = recs(out)
    # the pair in flight is the crash; the pairs never dispatched are not recorded at all
    assert [r["status"] for r in before].count("crash") <= 1 and len(before) < 12
    assert {r["status"] for r in before} <= {"pass", "crash"}
    info = json.loads((out / "run.json").read_text())
    assert "pair(s) never started and are not recorded" in info["stopped"] and "Traceback" not in err
    res = kl(*sel, "--out", str(out), "--resume", "--executor", "local")
    got = recs(out)
    assert len(got) == 12 and len({records.key(r) for r in got}) == 12 and got[:len(before)] == before, res.stderr


def test_no_ray_process_outlives_a_driver_killed_with_sigkill_that_started_its_own_ray(tmp_path):
    from conformance.run.processes import descendants

    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lab", *CI, "--backend", "toy-hang", "--out", str(out),
                             "--executor", "ray", "--address", "local"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_records(out / "cells.jsonl", 1, proc)   # a pair's worker sleeps in its kernel now
        started = descendants(proc.pid)
        assert len(started) > 5   # gcs, raylet, agents, the slot's actor, its worker...
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end and any(Path(f"/proc/{pid}").exists() for pid in started):
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = {pid: cmd for pid, cmd in _processes().items() if pid in started}
    assert not left, left


def test_an_unreachable_address_is_one_line_and_starts_no_ray(tmp_path):
    import socket

    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "conform", "--family", "toy", "--tier", "smoke",
                          "--backend", "toy-good", "--out", str(tmp_path / "o"), "--executor", "ray", "--address",
                          f"127.0.0.1:{port}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.splitlines() == [
        f"kernel-lab: error: --address 127.0.0.1:{port}: no Ray cluster reached (Connection refused); start one "
        "with `ray start --head`, or pass --address local for a Ray on this machine only"], res.stderr
    assert time.monotonic() - start < 60
