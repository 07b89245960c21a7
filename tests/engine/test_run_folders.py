"""Run folders that cannot lie, and workers pinned to GPUs: the CLI in this process on the toy family."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.cells import make_cell
from conformance.errors import UsageError
from conformance.registry import Backend
from conformance.run import estimate, processes, records, run_folder, selection
from conformance.run.counts import count
from kernel_lab import cli
from tests.cli_in_process import main, one_error_line

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["conform", "--family", "toy", "--tier", "smoke"]


@pytest.fixture(autouse=True)
def toy_lab(monkeypatch):
    """The toy family and backends, in this process and in the workers it spawns."""
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.engine.toy_backends")
    monkeypatch.delenv("KERNEL_LAB_FAKE_DEVICES", raising=False)
    import tests.engine.toy_backends  # noqa: F401  (registers the toy backends here)




def recs(folder):
    return records.read(Path(folder) / "cells.jsonl")


# ---------------------------------------------------------------- one run per folder

def test_a_folder_in_use_is_refused_and_the_lock_of_a_killed_run_is_taken_over(tmp_path, capsys):
    lock = tmp_path / run_folder.LOCK_NAME
    first = subprocess.Popen(
        [sys.executable, "-m", "kernel_lab", *SMOKE, "--backend", "toy-hang", "--timeout", "60", "--out",
         str(tmp_path)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good", "--out", tmp_path)
        assert rc == 2 and f"in use by pid {first.pid}" in one_error_line(err)
    finally:
        os.killpg(first.pid, signal.SIGKILL)   # the run and its worker, as a power cut would
        first.wait()
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-hang", "--out", tmp_path, "--filter", "n=99/")
    assert rc == 2 and "matches no cell" in err   # a bad request does not touch the lock
    assert json.loads(lock.read_text())["pid"] == first.pid
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-hang", "--timeout", "1", "--out", tmp_path, "--resume")
    assert f"stale lock of pid {first.pid}" in err and not lock.exists()
    assert rc == 1 and len(recs(tmp_path)) == 3


def test_the_lock_of_a_run_left_a_zombie_is_taken_over(tmp_path):
    """A run killed whose parent never reaps it (a container's first process that does not) stays a
    zombie: its pid exists, but it runs no more, and its lock is stale."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])   # exits at once; not waited for: a zombie
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{gone.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / run_folder.LOCK_NAME).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname()}))
        warned = []
        lock = run_folder.acquire_lock(tmp_path, warned.append)
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert warned == [f"{lock}: stale lock of pid {gone.pid} (no longer running); taking it over"]
        run_folder.release_lock(lock)
    finally:
        gone.wait()
    assert processes.pid_running(os.getpid())


def test_a_lock_from_another_host_is_not_taken_over(tmp_path, capsys):
    (tmp_path / run_folder.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere.example"}))
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good", "--out", tmp_path)
    assert rc == 2 and "on host elsewhere.example" in one_error_line(err)


# ---------------------------------------------------------------- resume

@pytest.mark.parametrize("change, words", [
    (["--tier", "ci"], "tier was 'smoke', now 'ci'"),
    (["--backend", "toy-good"], "backends was ['toy-wrong'], now ['toy-good']"),
    (["--filter", "n=8/"], "filter was None, now 'n=8/'"),
    (["--shard", "1/2"], "shard was None, now '1/2'"),
    (["--op", "scale"], "op was None, now 'scale'"),
])
def test_resume_continues_only_the_same_selection(tmp_path, capsys, change, words):
    (tmp_path / "cells.jsonl").write_text("")
    records.dump_json(tmp_path / "run.json", {"selection": selection.Selection(
        "smoke", "toy", backends=("toy-wrong",)).as_dict()})
    base = {"--tier": "smoke", "--backend": "toy-wrong"}
    base.update(dict(zip(change[::2], change[1::2])))
    args = ["conform", "--family", "toy", *[x for kv in base.items() for x in kv], "--out", tmp_path, "--resume"]
    rc, _, err = main(capsys, *args)
    assert rc == 2 and words in one_error_line(err) and "same selection" in err


def test_resume_exit_status_and_counts_cover_every_record_in_the_folder(tmp_path, capsys):
    args = [*SMOKE, "--backend", "toy-wrong", "--out", tmp_path]
    assert main(capsys, *args)[0] == 1
    rc, out, err = main(capsys, *args, "--resume")  # nothing left to run: the failures still count
    assert rc == 1 and "0 to run" in err and "3 already recorded" in err
    assert json.loads((tmp_path / "run.json").read_text())["counts"] == {"toy-wrong": {"fail": 3}}
    row = next(line.split() for line in out.splitlines() if line.startswith("toy-wrong"))
    assert row == ["toy-wrong", "0", "3", "0", "0", "0", "0", "0", "3"]   # pass fail ... total
    rc, _, err = main(capsys, *args)  # a second run into the same folder would double every count
    assert rc == 2 and "--resume" in one_error_line(err) and len(recs(tmp_path)) == 3


# ---------------------------------------------------------------- disk full: tests/engine/test_run_full_disk.py


# ---------------------------------------------------------------- merge

def test_merge_checks_selection_finished_shards_all_there_no_overlap_and_leaves_no_empty_folder(tmp_path, capsys):
    base = [*SMOKE, "--backend", "toy-good"]
    for k in (1, 2, 3):
        assert main(capsys, *base, "--shard", f"{k}/3", "--out", tmp_path / f"s{k}")[0] == 0
    assert main(capsys, "conform", "--family", "toy", "--tier", "ci", "--backend", "toy-good", "--filter",
                "n=1[01]/", "--shard", "1/3", "--out", tmp_path / "ci1")[0] == 0
    out = tmp_path / "merged"
    for inputs, words in [
        (["s1", "s2"], "shard 3/3 missing"),
        (["s1", "s1", "s2", "s3"], "shard 1/3 given more than once"),
        (["ci1", "s2", "s3"], "tier was 'ci', now 'smoke'"),
        (["s1", "s2", "nowhere"], "nowhere is not a run folder"),
    ]:
        rc, _, err = main(capsys, "merge", "--out", out, *[tmp_path / i for i in inputs])
        assert rc == 2 and words in one_error_line(err) and not out.exists()
    info = json.loads((tmp_path / "s3" / "run.json").read_text())
    records.dump_json(tmp_path / "s3" / "run.json", {k: v for k, v in info.items() if k != "finished"})
    rc, _, err = main(capsys, "merge", "--out", out, *[tmp_path / f"s{k}" for k in (1, 2, 3)])
    assert rc == 2 and "s3 did not finish" in one_error_line(err) and not out.exists()
    records.dump_json(tmp_path / "s3" / "run.json", info)
    dup = recs(tmp_path / "s1")[0]
    with open(tmp_path / "s2" / "cells.jsonl", "a") as fh:
        fh.write(json.dumps(dup) + "\n")
    rc, _, err = main(capsys, "merge", "--out", out, *[tmp_path / f"s{k}" for k in (1, 2, 3)])
    assert rc == 2 and "is in both" in one_error_line(err) and not out.exists()
    (tmp_path / "s2" / "cells.jsonl").write_text("".join(
        ln + "\n" for ln in (tmp_path / "s2" / "cells.jsonl").read_text().splitlines()[:-1]))
    shards = [tmp_path / f"s{k}" for k in (1, 2, 3)]
    assert main(capsys, "merge", "--out", out, *shards)[0] == 0
    assert len(recs(out)) == 3
    assert json.loads((out / "run.json").read_text())["selection"]["shard"] is None


def _edit_shard(folder, edit):
    """Edit the first record of a shard and its run.json's counts to match, as a forger would."""
    rs = recs(folder)
    rs[0] = edit(rs[0])
    (folder / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    info = json.loads((folder / "run.json").read_text())
    info["counts"] = {b: dict(c) for b, c in count(rs).items()}
    (folder / "run.json").write_text(json.dumps(info))


def _fail_to_pass(r):
    return {**r, "status": "pass", "reason": ""}


def _params_off_the_id(r):
    return {**r, "params": {**r["params"], "n": r["params"]["n"] + 1}}


def _pass_to_fail(r):
    return {**r, "status": "fail", "reason": "planted"}


@pytest.mark.parametrize("edit, backend, words", [
    (_fail_to_pass, "toy-wrong", "(status pass, but output 'y' failed)"),
    (_params_off_the_id, "toy-good", "(its family, op, params and seed make the id 'toy/scale/n=9/"),
    (_pass_to_fail, "toy-good", "(status fail, but every output passed)"),
])
def test_a_record_that_contradicts_itself_is_refused_by_merge_report_and_resume(tmp_path, capsys, edit, backend,
                                                                                words):
    base = [*SMOKE, "--backend", backend]
    for k in (1, 2):
        main(capsys, *base, "--shard", f"{k}/2", "--out", tmp_path / f"s{k}")
    _edit_shard(tmp_path / "s1", edit)
    for argv in (["merge", "--out", tmp_path / "merged", tmp_path / "s1", tmp_path / "s2"],
                 ["report", tmp_path / "s1", "--out", tmp_path / "report"],
                 [*base, "--shard", "1/2", "--out", tmp_path / "s1", "--resume"]):
        rc, _, err = main(capsys, *argv)
        line = one_error_line(err)
        assert rc == 2 and f"{tmp_path / 's1' / 'cells.jsonl'}:1: a record that contradicts itself " in line, line
        assert words in line
    assert not (tmp_path / "merged").exists()


# ---------------------------------------------------------------- empty selections, bad input

@pytest.mark.parametrize("args, words", [
    (["--filter", "n=99/"], "the selection matches no cell"),
    (["--shard", "3/3", "--filter", "n=8/"], "the selection matches no cell"),
    (["--backend", ""], "the list of backends is empty"),
    (["--backend", ","], "the list of backends is empty"),
    (["--backend", "numpy-ref"], "none of the backends numpy-ref implements"),
    (["--jobs", "0"], "--jobs 0"),
    (["--timeout", "0"], "--timeout 0"),
])
def test_a_selection_without_cells_or_backends_exits_2(tmp_path, capsys, args, words):
    rc, _, err = main(capsys, *SMOKE, *args, "--out", tmp_path / "o")
    assert rc == 2 and words in one_error_line(err) and not (tmp_path / "o").exists()


CORRUPT = {
    "run.json: not JSON": ("run.json", b"{not json"),
    "run.json: not UTF-8": ("run.json", b'{"selection": "\xff\xfe"}'),
    "run.json: a folder": ("run.json", None),
    "cells.jsonl: not JSON": ("cells.jsonl", b'{"id": 1\n'),
    "cells.jsonl: not UTF-8": ("cells.jsonl", b'{"id": "\xc3\x28"}\n'),
    "cells.jsonl: a folder": ("cells.jsonl", None),
}


@pytest.mark.parametrize("command", ["conform", "report", "merge"])
@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_or_unreadable_inputs_give_one_line_naming_the_file(tmp_path, capsys, command, case):
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("")
    records.dump_json(run / "run.json", {"selection": selection.Selection(
        "smoke", "toy", backends=("toy-good",), shard="1/1").as_dict()})
    name, data = CORRUPT[case]
    (run / name).unlink()
    if data is None:
        (run / name).mkdir()
    else:
        (run / name).write_bytes(data)
    argv = {"conform": [*SMOKE, "--backend", "toy-good", "--shard", "1/1", "--out", run, "--resume"],
            "report": ["report", run],
            "merge": ["merge", "--out", tmp_path / "merged", run]}[command]
    rc, _, err = main(capsys, *argv)
    assert rc == 2 and str(run / name) in one_error_line(err)


@pytest.mark.parametrize("name", ["run.json", "cells.jsonl", run_folder.LOCK_NAME])
def test_a_folder_where_a_run_folders_file_should_be_is_named_in_one_line(tmp_path, capsys, name):
    (tmp_path / name).mkdir()
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good", "--out", tmp_path)
    assert rc == 2 and str(tmp_path / name) in one_error_line(err) and "is a folder" in err


def test_only_usage_errors_exit_2_an_internal_key_error_is_a_bug(capsys, monkeypatch):
    from conformance import families, registry

    with pytest.raises(UsageError, match="unknown backend 'nope'"):
        registry.get("nope")
    with pytest.raises(UsageError, match="unknown family 'nope'"):
        families.get("nope")

    def broken(*args, **kwargs):
        return {}["a key the code forgot"]

    monkeypatch.setattr(selection, "select_cells", broken)
    with pytest.raises(KeyError):
        cli.main(["list-cells", "--tier", "smoke"])


# ---------------------------------------------------------------- timeouts, durations, messages

def test_timeout_from_the_cli_and_crash_records_carry_their_real_duration(tmp_path, capsys):
    rc, _, _ = main(capsys, *SMOKE, "--backend", "toy-hang", "--filter", "n=8/",
                    "--timeout", "1", "--out", tmp_path / "hang")
    assert rc == 1
    (hang,) = recs(tmp_path / "hang")
    assert hang["status"] == "crash" and hang["reason"] == "timeout: no result after 1 s"
    assert 1.0 <= hang["duration_s"] < 3.0  # the backend's own timeout is 3 s
    # the abort in a run of its own: under load a worker's start alone can take the 1 s above
    rc, _, _ = main(capsys, *SMOKE, "--backend", "toy-abort", "--filter", "n=9/", "--out", tmp_path / "abort")
    assert rc == 1
    (abort,) = recs(tmp_path / "abort")
    assert abort["status"] == "crash" and "SIGABRT" in abort["reason"] and abort["duration_s"] > 0


def test_exception_messages_stored_in_records_are_cut_to_a_sane_length(tmp_path, capsys):
    main(capsys, *SMOKE, "--backend", "toy-raise", "--filter", "n=8/", "--out", tmp_path)
    (rec,) = recs(tmp_path)
    assert rec["status"] == "error" and rec["reason"].startswith("ValueError: bad input xxx")
    assert len(rec["reason"]) < records.MAX_TEXT + 60 and "more characters cut]" in rec["reason"]
    assert len(rec["traceback"]) < records.MAX_TEXT + 60
    assert records.clip(rec["reason"]) == rec["reason"]   # written again by a merge: cut once


# ---------------------------------------------------------------- ETA, work budget, warnings

def test_the_estimate_comes_from_each_backends_own_cost_and_is_refined_by_records():
    cheap = Backend("c", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {},
                    seconds_per_cell=0.5, seconds_per_work=0.0)
    slow = Backend("s", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {},
                   seconds_per_cell=0.0, seconds_per_work=1.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in (10, 20, 30)]
    other = make_cell("toy", "other", n=40, factor=1.0)
    assert estimate.cell_work(cells[1]) == 20
    est = estimate.Estimator([(c, b) for c in cells for b in (cheap, slow)] + [(other, slow)], jobs=2)
    assert est.per_backend() == {"c": 1.5, "s": 100.0} and est.remaining() == pytest.approx(101.5 / 2)
    # a worker's first pair of a backend (compile included) is all there is to go by, until a steady one
    rec = {"backend": "s", "op": "scale", "status": "pass", "first_in_worker": True}
    est.done({**rec, "id": cells[0].id, "wall_s": 60.0})
    assert est.per_backend()["s"] == pytest.approx((20 + 30 + 40) * 6) and est.compile_remaining() == 0
    # then a steady pair at half its estimate sets the backend's rate (every op of the backend): the
    # first pair's time counts apart, as compile time; a backend not seen yet goes by the machine's
    # rate (this machine against the prices' one: the steady pairs here, a declared cost model's
    # first pairs having no startup estimate to compare with)
    est.done({**rec, "id": cells[1].id, "wall_s": 10.0, "first_in_worker": False})
    assert est.per_backend()["s"] == pytest.approx((30 + 40) * 0.5) and est.per_backend()["c"] == 1.5 * 0.5
    # a pair far over its prediction (a new shape autotuned) adds its excess as compile time that the
    # pairs left are expected to meet as often; the rate stays
    est.done({**rec, "id": cells[2].id, "wall_s": 100.0, "first_in_worker": False})
    assert est.rate["s"] == pytest.approx(0.5) and est.compile_per_pair("s") == pytest.approx((100 - 15) / 2)
    assert est.per_backend()["s"] == pytest.approx(40 * 0.5 + 42.5) and est.compile_remaining() == pytest.approx(42.5 / 2)


def test_the_eta_follows_wall_time_and_one_jit_does_not_blow_it_up():
    """As the FLA run on the H200: a cost model of 1 s a pair, every pair 30 s of wall time, the
    first one 80 s (JIT): after three pairs the ETA is within 10% of the 17 x 30 s left."""
    b = Backend("g", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, seconds_per_cell=1.0,
                seconds_per_work=0.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(20)]
    est = estimate.Estimator([(c, b) for c in cells], jobs=1)
    for i, wall in enumerate((80.0, 30.0, 31.0)):
        est.done({"id": cells[i].id, "backend": "g", "op": "scale", "status": "pass", "wall_s": wall,
                  "duration_s": 0.5, "first_in_worker": i == 0})
    assert est.remaining() == pytest.approx(17 * 30, rel=0.1)


def test_conform_says_how_long_it_expects_before_it_starts(tmp_path, capsys):
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good,toy-interpreted", "--filter", "n=8/",
                      "--out", tmp_path)
    first = err.splitlines()[0]
    # 8 units * 100 s, a range until pairs have finished
    assert rc == 0 and "2 to run" in first and "expect 9m20s-18m40s" in first
    assert "toy-interpreted 13m20s" in first


def test_interpreter_backends_skip_cells_over_the_work_budget_unless_asked(tmp_path, capsys):
    main(capsys, *SMOKE, "--backend", "toy-interpreted", "--out", tmp_path / "a", "--timeout", "30")
    by = {r["params"]["n"]: r for r in recs(tmp_path / "a")}
    assert by[8]["status"] == "pass" and by[9]["status"] == "pass"   # work 8, 9 <= budget 9
    assert by[10]["status"] == "skip"
    assert by[10]["reason"].startswith("over the interpreter work budget (10 > 9 tokens*heads*dims)")
    assert "--no-budget" in by[10]["reason"]
    main(capsys, *SMOKE, "--backend", "toy-interpreted", "--no-budget", "--out", tmp_path / "b")
    assert {r["status"] for r in recs(tmp_path / "b")} == {"pass"}
    main(capsys, *SMOKE, "--backend", "toy-interpreted", "--filter", "n=10/", "--out", tmp_path / "c")
    assert [r["status"] for r in recs(tmp_path / "c")] == ["pass"]


def test_warnings_from_workers_go_into_the_record_not_the_console(tmp_path, capfd):
    rc = cli.main([*SMOKE, "--backend", "toy-warn", "--filter", "n=8/", "--out", str(tmp_path)])
    _, err = capfd.readouterr()   # the worker's own stderr included
    (rec,) = recs(tmp_path)
    assert rc == 0 and rec["warnings"][0].startswith("RuntimeWarning: overflow encountered in the toy kernel")
    assert "overflow" not in err


# ---------------------------------------------------------------- several GPUs

def test_gpu_workers_are_pinned_one_per_device_and_a_faulting_device_is_retired(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAKE_DEVICES", "0,1,2")
    rc, _, err = main(capsys, "conform", "--family", "toy", "--tier", "ci", "--backend",
                      "toy-gpu-fault-1,toy-good", "--out", tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    rs = recs(tmp_path)
    gpu = [r for r in rs if r["backend"] == "toy-gpu-fault-1"]
    assert rc == 0 and run["jobs"] == 3 and run["devices"] == ["cuda:0", "cuda:1", "cuda:2"]
    assert {r["status"] for r in rs} == {"pass"} and len(rs) == 24
    assert {r["device"] for r in gpu} == {"cuda:0", "cuda:2"}
    assert {r["device"] for r in rs if r["backend"] == "toy-good"} == {"cpu"}
    (retried,) = [r for r in gpu if "retried_from" in r]
    assert retried["retried_from"] == "cuda:1" and retried["device"] in ("cuda:0", "cuda:2")
    assert list(run["retired_devices"]) == ["1"] and "SIGABRT" in run["retired_devices"]["1"]
    assert "device cuda:1 retired" in err


def test_a_pair_that_crashes_on_two_devices_is_a_crash_and_the_first_device_comes_back(tmp_path, capsys,
                                                                                      monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAKE_DEVICES", "0,1")
    rc, _, _ = main(capsys, *SMOKE, "--backend", "toy-gpu-fault-all,toy-gpu", "--filter", "n=8/",
                    "--out", tmp_path)
    by = {r["backend"]: r for r in recs(tmp_path)}
    crash = by["toy-gpu-fault-all"]
    assert rc == 1 and crash["status"] == "crash" and "SIGABRT" in crash["reason"]
    assert {crash["retried_from"], crash["device"]} == {"cuda:0", "cuda:1"}
    assert by["toy-gpu"]["status"] == "pass"
    assert json.loads((tmp_path / "run.json").read_text())["retired_devices"] == {}


def test_the_interpreter_budget_admits_every_ci_cell_and_skips_the_largest_full_ones(monkeypatch):
    monkeypatch.delenv("KERNEL_LAB_FAMILY_MODULES")
    from conformance import registry

    interp = [b for b in registry.builtin().values() if b.env.get("TRITON_INTERPRET") == "1"]
    assert interp and all(b.work_budget is not None for b in interp)

    def over(tier):
        return [(c.id, b.name) for b in interp for c in selection.select_cells(tier)
                if b.skip_reason(c) is None and estimate.cell_work(c) > estimate.work_budget(c, b)]

    assert over("ci") == [] and len(over("full")) > 100


def test_records_carry_the_pairs_wall_time_and_whether_it_was_the_workers_first(tmp_path, capsys):
    rc, _, _ = main(capsys, *SMOKE, "--backend", "toy-good,toy-bf16-x", "--out", tmp_path)
    recs = records.read(tmp_path / "cells.jsonl")
    ran = [r for r in recs if r["status"] != "skip"]
    assert rc == 0 and len(ran) >= 4
    assert all(r["wall_s"] >= r["duration_s"] > 0 for r in ran)
    firsts = [r["backend"] for r in ran if r["first_in_worker"]]
    assert sorted(firsts) == ["toy-bf16-x", "toy-good"]   # one worker: each backend's first pair only


def test_before_a_steady_pair_the_eta_goes_by_the_first_pairs():
    """The H200 run of four FLA cells on two workers: both first pairs took 27-28 s (JIT and
    autotune) against a cost model of 0.05 s; the two pairs left are expected at about that, not 0 s."""
    b = Backend("fla-like", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}, seconds_per_cell=0.05,
                seconds_per_work=0.0)
    cells = [make_cell("toy", "scale", n=n, factor=1.0) for n in range(4)]
    est = estimate.Estimator([(c, b) for c in cells], jobs=2)
    assert est.remaining() == pytest.approx(0.1)
    for c, wall in zip(cells, (26.7, 28.4)):
        est.done({"id": c.id, "backend": "fla-like", "op": "scale", "status": "pass", "wall_s": wall,
                  "first_in_worker": True})
    assert est.remaining() == pytest.approx((26.7 + 28.4) / 2, rel=0.01)
