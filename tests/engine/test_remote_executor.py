"""The remote executor on a fake engine (tests/engine/fake_cluster.py): per-node availability, the
device-class split, late duplicates dropped, a lost node retired and its pairs retried once,
another build refused, resume across executors; and `--shard env`, `--shard-by cost`, and
`--executor ray` without Ray."""
import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conformance.errors import UsageError
from conformance.run import records, selection
from tests.engine.test_runner import ENV, ROOT, kl, statuses

TOY = ["conform", "--family", "toy", "--tier", "smoke"]


def fake(tmp_path, spec, *args):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.run([sys.executable, "-m", "tests.engine.fake_cluster", str(path), *args, "--executor", "ray"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def recs(out):
    return records.read(Path(out) / "cells.jsonl")


def run_json(out):
    return json.loads((Path(out) / "run.json").read_text())


def test_a_pair_goes_only_to_nodes_that_can_run_it_and_skips_name_every_nodes_answer(tmp_path):
    spec = {"nodes": [{"name": "a", "class": "lab"},
                      {"name": "b", "class": "lab", "probes": {"toy-absent": [True, "has the hardware"]}}]}
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-good,toy-absent,toy-gpu", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    by = {records.key(r): r for r in recs(tmp_path / "o")}
    assert len(by) == 9
    absent = [r for (_, b), r in by.items() if b == "toy-absent"]
    assert {(r["status"], r["node"]) for r in absent} == {("pass", "b")}
    assert {r["node"] for (_, b), r in by.items() if b == "toy-good"} <= {"a", "b"}
    # a GPU backend on nodes without a GPU runs on their CPU slot, as the local pool runs it where no
    # device is visible (its probe decides), so every executor covers the same pairs
    gpu = [r for (_, b), r in by.items() if b == "toy-gpu"]
    assert {r["status"] for r in gpu} == {"pass"} and {r["device"] for r in gpu} == {"cpu"}
    info = run_json(tmp_path / "o")
    assert set(info["nodes"]) == {"a", "b"} and info["nodes"]["a"]["fingerprint"]["cpu"]["cores"]
    assert info["backends"]["toy-absent"] == {**info["backends"]["toy-absent"], "available": True, "reason": "on b"}
    assert info["executor"] == "fake" and info["duplicates_dropped"] == 0


def test_device_class_all_writes_one_ordinary_run_folder_per_class(tmp_path):
    spec = {"nodes": [{"name": "g", "class": "h200", "gpus": 2, "cpu": False},
                      {"name": "x", "class": "cpu-amx", "probes": {"toy-absent": [True, "amx"]}}]}
    out = tmp_path / "o"
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-gpu,toy-absent", "--device-class", "all", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "device class cpu-amx:" in res.stdout and "device class h200:" in res.stdout
    gpu, amx = recs(out / "h200"), recs(out / "cpu-amx")
    assert {(r["backend"], r["status"], r["node"]) for r in gpu if r["status"] != "skip"} == {("toy-gpu", "pass", "g")}
    assert {r["device"] for r in gpu if r["status"] == "pass"} <= {"cuda:0", "cuda:1"}
    assert {(r["backend"], r["status"]) for r in gpu if r["status"] == "skip"} == {("toy-absent", "skip")}
    assert {(r["backend"], r["status"], r.get("node")) for r in amx} == {
        ("toy-absent", "pass", "x"), ("toy-gpu", "pass", "x")}
    assert list(run_json(out / "h200")["nodes"]) == ["g"] and run_json(out / "cpu-amx")["device_class"] == "cpu-amx"
    # each class folder is an ordinary run folder: a resume finds it complete
    again = kl(*TOY, "--backend", "toy-gpu,toy-absent", "--out", str(out / "cpu-amx"), "--resume", check_rc=0)
    assert "0 to run" in again.stderr
    # without --device-class, a cluster of two classes is refused in one line
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-gpu", "--out", str(tmp_path / "p"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "several device classes (cpu-amx: x; h200: g)" in res.stderr


def test_late_duplicates_are_dropped_and_counted(tmp_path):
    spec = {"nodes": [{"name": "a", "class": "lab", "duplicate": True}]}
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-good,toy-wrong", "--out", str(tmp_path / "o"))
    assert res.returncode == 1, res.stderr
    got = recs(tmp_path / "o")
    assert len(got) == 6 and len({records.key(r) for r in got}) == 6
    assert run_json(tmp_path / "o")["duplicates_dropped"] == 6
    assert "6 late duplicate record(s) dropped" in res.stderr


def test_a_lost_node_is_retired_and_its_pair_retried_once_elsewhere(tmp_path):
    # a is lost on its first call: the first dispatch fills every slot, so a gets that call whatever the timing
    spec = {"nodes": [{"name": "a", "class": "lab", "gpus": 1, "cpu": False, "lose_on_call": 1},
                      {"name": "b", "class": "lab", "gpus": 1, "cpu": False}]}
    res = fake(tmp_path, spec, "conform", "--family", "toy", "--tier", "ci", "--backend", "toy-gpu",
               "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    got = recs(tmp_path / "o")
    assert len(got) == 12 and len({records.key(r) for r in got}) == 12
    assert {r["status"] for r in got} == {"pass"}
    retried = [r for r in got if "retried_from" in r]
    assert len(retried) == 1 and retried[0]["retried_from"] == "a/cuda:0" and retried[0]["node"] == "b"
    assert Counter(r["node"] for r in got)["a"] == 0
    info = run_json(tmp_path / "o")
    assert list(info["retired_devices"]) == ["a/cuda:0"]
    assert "warning: slot a/cuda:0 retired" in res.stderr


def test_a_pair_lost_twice_is_a_crash_and_pairs_never_started_stay_unrecorded_for_resume(tmp_path):
    # a is lost at once; its pair goes to b, which is lost on that second call: nothing is left
    spec = {"nodes": [{"name": "a", "class": "lab", "lose_on_call": 1}, {"name": "b", "class": "lab", "lose_on_call": 2}]}
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-good", "--out", str(tmp_path / "o"))
    assert res.returncode == 3, res.stderr
    got = recs(tmp_path / "o")
    assert len(got) == 2 and len({records.key(r) for r in got}) == 2
    assert Counter(r["status"] for r in got) == {"pass": 1, "crash": 1}
    (twice,) = [r for r in got if r["status"] == "crash"]
    assert (twice["node"], twice["retried_from"]) == ("b", "a/cpu")
    assert twice["reason"].startswith("slot b/cpu lost: node b stopped answering; lost before on a/cpu")
    stopped = run_json(tmp_path / "o")["stopped"]
    assert stopped.startswith(f"no slot left to run on (a/cpu retired (node a stopped answering on {twice['id']} "
                              "(toy-good)), b/cpu retired (") and "1 pair(s) never started" in stopped
    assert res.stderr.strip().splitlines()[-1] == f"kernel-lab: error: {stopped}"
    res = kl(*TOY, "--backend", "toy-good", "--out", str(tmp_path / "o"), "--resume")
    assert res.returncode == 1 and len(recs(tmp_path / "o")) == 3, res.stderr   # the third pair ran


def test_a_node_of_another_build_is_refused_by_name(tmp_path):
    spec = {"nodes": [{"name": "a", "class": "lab"}, {"name": "old", "class": "lab", "commit": "0" * 40}]}
    res = fake(tmp_path, spec, *TOY, "--backend", "toy-good", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "node old runs another build (commit 0000000000000000000000000000000000000000, driver " in res.stderr
    assert "node a " not in res.stderr and not (tmp_path / "o" / "cells.jsonl").exists()


def test_resume_across_executors_gives_the_records_of_one_uninterrupted_run(tmp_path):
    spec = {"nodes": [{"name": "a", "class": "lab"}, {"name": "b", "class": "lab"}]}
    sel = ["conform", "--family", "toy", "--tier", "ci", "--backend", "toy-good,toy-wrong"]
    kl(*sel, "--out", str(tmp_path / "local"), check_rc=1)
    want = statuses(tmp_path / "local")
    # remote, cut short, resumed locally
    assert fake(tmp_path, spec, *sel, "--out", str(tmp_path / "r")).returncode == 1
    path = tmp_path / "r" / "cells.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:9]))
    kl(*sel, "--out", str(tmp_path / "r"), "--resume", "--executor", "local", check_rc=1)
    assert statuses(tmp_path / "r") == want and len(recs(tmp_path / "r")) == 24
    # local, cut short, resumed remotely
    path = tmp_path / "local" / "cells.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    res = fake(tmp_path, spec, *sel, "--out", str(tmp_path / "local"), "--resume")
    assert res.returncode == 1, res.stderr
    got = recs(tmp_path / "local")
    assert statuses(tmp_path / "local") == want and len(got) == 24
    assert {r["node"] for r in got[5:]} <= {"a", "b"} and run_json(tmp_path / "local")["executor"] == "fake"


def test_executor_ray_without_ray_is_one_line_and_exit_2(tmp_path):
    blocked = tmp_path / "blocked" / "ray"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = {**ENV, "PYTHONPATH": f"{blocked.parent}:{ROOT}"}
    res = subprocess.run([sys.executable, "-m", "kernel_lab", *TOY, "--backend", "toy-good", "--out",
                          str(tmp_path / "o"), "--executor", "ray"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--executor ray needs Ray, which is not installed: pip install 'kernel-lab[ray]'" in res.stderr


@pytest.mark.parametrize("environ, count, want", [
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"}, None, "3/4"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, None, "1/4"),
    ({"JOB_COMPLETION_INDEX": "0"}, 3, "1/3"),
    ({"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "2"}, None, "2/2"),
    ({"BUILDKITE_PARALLEL_JOB": "4", "BUILDKITE_PARALLEL_JOB_COUNT": "5"}, None, "5/5"),
])
def test_shard_env_reads_each_scheduler(environ, count, want):
    assert selection.shard_from_env(environ, count)[0] == want


@pytest.mark.parametrize("environ, count, message", [
    ({}, None, "no scheduler's index is set"),
    ({"JOB_COMPLETION_INDEX": "1"}, None, "pass --shard-count N"),
    ({"CI_NODE_INDEX": "3", "CI_NODE_TOTAL": "2"}, None, "gives part 3 of 2"),
    ({"CI_NODE_INDEX": "x", "CI_NODE_TOTAL": "2"}, None, "CI_NODE_INDEX='x' is not a whole number"),
    ({"CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "2", "BUILDKITE_PARALLEL_JOB": "0"}, None, "several schedulers"),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0",
      "SLURM_ARRAY_TASK_STEP": "4"}, None, "has step 4"),
])
def test_shard_env_refuses_what_it_cannot_resolve(environ, count, message):
    with pytest.raises(UsageError, match=message):
        selection.shard_from_env(environ, count)


def test_shard_env_records_the_resolved_part_and_cost_shards_merge_to_the_whole_run(tmp_path):
    common = ["conform", "--family", "toy", "--tier", "ci", "--backend", "toy-good,toy-wrong"]
    kl(*common, "--out", str(tmp_path / "all"), check_rc=1)
    for k in (1, 2, 3):
        res = subprocess.run([sys.executable, "-m", "kernel_lab", *common, "--shard", "env", "--shard-by", "cost",
                              "--out", str(tmp_path / f"s{k}")], cwd=ROOT, capture_output=True, text=True,
                             env={**ENV, "CI_NODE_INDEX": str(k), "CI_NODE_TOTAL": "3"}, timeout=300)
        assert res.returncode == 1, res.stderr
        sel = run_json(tmp_path / f"s{k}")["selection"]
        assert sel["shard"] == f"{k}/3" and sel["shard_by"] == "cost"
        assert sel["shard_from"] == f"GitLab parallel: CI_NODE_INDEX={k}, CI_NODE_TOTAL=3"
    sizes = sorted(len(recs(tmp_path / f"s{k}")) for k in (1, 2, 3))
    assert sum(sizes) == 24 and sizes[-1] - sizes[0] <= 2
    kl("merge", "--out", str(tmp_path / "m"), *(str(tmp_path / f"s{k}") for k in (1, 2, 3)), check_rc=1)  # toy-wrong fails
    assert statuses(tmp_path / "m") == statuses(tmp_path / "all")
    # merge refuses to join a cost shard with an index shard
    kl(*common, "--shard", "3/3", "--out", str(tmp_path / "i3"), check_rc=1)
    res = kl("merge", "--out", str(tmp_path / "m2"), str(tmp_path / "s1"), str(tmp_path / "s2"), str(tmp_path / "i3"))
    assert res.returncode == 2 and "shard_by was 'cost', now None" in res.stderr


@pytest.mark.parametrize("gpu_slot", [False, True])
def test_the_remote_items_are_the_local_pools_a_gpu_backend_without_a_gpu_slot_with_the_cpu_ones(gpu_slot):
    """The items a cluster's slots get are those the local pool queues: a GPU backend in a run without a
    GPU slot runs in the CPU slot's workers, in one item with the cell's CPU backends (one call, one
    setup); the work's order kept within each environment, the environments in the order of their first."""
    import types

    from conformance.cells import make_cell
    from conformance.registry import Backend
    from conformance.run import remote, workers

    def toy(name, **kwargs):
        return Backend(name, {"toy": ("scale",)}, lambda: (True, ""), lambda cell, inputs: {}, **kwargs)

    good, gpu = toy("toy-good"), toy("toy-gpu", uses_gpu=True)
    other = toy("toy-other", env={"KERNEL_LAB_TOY_GROUP": "b"})
    probes = {b.name: (True, "yes") for b in (good, gpu, other)}
    ex = remote.RemoteExecutor(types.SimpleNamespace(name="fake"))
    ex.slots = [remote.RemoteSlot("a", None, {"probes": probes}, None)]
    ex.slots += [remote.RemoteSlot("a", "0", {"probes": probes}, None)] if gpu_slot else []
    ex.nodes, ex.device_class = {"a": {"device_class": "lab"}}, "lab"
    c = [make_cell("toy", "scale", n=n, factor=1.0) for n in (8, 9, 10, 11)]
    work = [(c[0], [other]), (c[1], [gpu, good]), (c[2], [other]), (c[3], [gpu])]
    got = [(it.cell["n"], [b.name for b in it.backends], it.gpu) for it in ex._items(work)]
    assert got == [(it.cell["n"], [b.name for b in it.backends], it.gpu) for it in workers.items(work, gpus=gpu_slot)]
    assert ((9, ["toy-gpu", "toy-good"], False) in got) != gpu_slot


def test_cost_shards_balance_the_estimate_longest_first():
    from conformance.cells import make_cell
    from conformance.registry import Backend

    b = Backend("b", {"toy": ("scale",)}, lambda: (True, ""), lambda cell, inputs: {},
                seconds_per_cell=0.0, seconds_per_work=1.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0, seed=0) for n in (9, 1, 8, 2, 7, 3)]
    parts = [selection.cost_shard(cells, [b], k, 2) for k in (1, 2)]
    assert [[c["n"] for c in p] for p in parts] == [[9, 1, 2, 3], [8, 7]]   # 15 and 15


@pytest.mark.parametrize("fp, want", [
    ({"gpus": [{"name": "NVIDIA H200"}], "cpu": {"flags": ["amx_bf16"]}}, "h200"),
    ({"gpus": [{"name": "AMD Instinct MI300X"}], "cpu": {"flags": []}}, "mi300x"),
    ({"gpus": [], "cpu": {"flags": ["avx512f", "amx_tile", "amx_bf16"]}}, "cpu-amx"),
    ({"gpus": [], "cpu": {"flags": ["avx2", "avx512f"]}}, "cpu-avx512"),
    ({"gpus": [], "cpu": {"flags": ["avx2"]}}, "cpu"),
])
def test_device_class_from_the_fingerprint(fp, want):
    from conformance.run import node_report
    assert node_report.device_class(fp) == want
    assert node_report.device_class(fp, "lab-7") == "lab-7"


def test_node_prints_the_ray_start_line_from_doctor():
    from kernel_lab import cli
    fp = {"gpus": [{"name": "NVIDIA H200"}] * 8, "cpu": {"cores": 128, "usable_cores": 96}}
    assert cli.node_command(fp, "head:6379") == [
        "ray", "start", "--address", "head:6379", "--num-gpus", "8", "--num-cpus", "96", "--disable-usage-stats"]
    assert cli.node_command(fp, None)[2:7] == ["--head", "--port", "6379", "--num-gpus", "8"]


def test_node_start_runs_ray_with_its_arguments_as_given_never_a_shell(tmp_path):
    # a fake `ray` first on PATH writes down its argv and the class it was given
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$0.argv"\n'
                                 'printf "%s" "$KERNEL_LAB_DEVICE_CLASS" > "$0.class"\n')
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    hostile_address = "head:6379 --head; touch PWNED"
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "node", "--start", "--address", hostile_address,
                          "--device-class", "h200"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    argv = (bin_dir / "ray.argv").read_text().splitlines()
    assert argv[:3] == ["start", "--address", hostile_address] and (bin_dir / "ray.class").read_text() == "h200"
    line = res.stdout.splitlines()[-1]
    assert shlex.split(line) == ["KERNEL_LAB_DEVICE_CLASS=h200", "ray", *argv]   # printed quoted: it round-trips
    assert not (tmp_path / "PWNED").exists()
    # a class that would run a shell (or name another folder) is refused in one line, nothing started
    (bin_dir / "ray.argv").unlink()
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "node", "--start", "--device-class",
                          "x sh -c 'touch PWNED' sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "--device-class" in res.stderr
    assert not (bin_dir / "ray.argv").exists() and not (tmp_path / "PWNED").exists()
