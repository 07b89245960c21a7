"""The runner and CLI on a toy family: records, crashes, timeouts, resume, shards, bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.run import records

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "KERNEL_LAB_FAMILY_MODULES": "tests.engine.toy_family",
       "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends", "PYTHONPATH": str(ROOT)}


def kl(*args, check_rc=None):
    res = subprocess.run([sys.executable, "-m", "kernel_lab", *args], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    if check_rc is not None:
        assert res.returncode == check_rc, res.stderr + res.stdout
    return res


def statuses(out):
    return {(r["id"], r["backend"]): r["status"] for r in records.read(Path(out) / "cells.jsonl")}


def test_failing_cell_gives_exit_1_and_every_pair_has_a_record(tmp_path):
    res = kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good,toy-wrong,toy-absent",
             "--out", str(tmp_path), "--jobs", "2", check_rc=1)
    st = statuses(tmp_path)
    assert len(st) == 9
    assert {s for (i, b), s in st.items() if b == "toy-good"} == {"pass"}
    assert {s for (i, b), s in st.items() if b == "toy-wrong"} == {"fail"}
    assert {s for (i, b), s in st.items() if b == "toy-absent"} == {"skip"}
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["backends"]["toy-absent"]["reason"] == "needs hardware this machine lacks"
    assert "cpu" in run and "versions" in run and run["git"]["commit"]
    assert "toy-good" in res.stdout and "pass" in res.stdout  # the summary table


def test_run_json_records_each_backends_rounding_model_and_the_cells_are_judged_by_it(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good,toy-bf16-x",
       "--out", str(tmp_path), check_rc=0)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["rounding_models"] == {"toy-good": {"toy": "exact"}, "toy-bf16-x": {"toy": "bf16-x"}}
    recs = records.read(tmp_path / "cells.jsonl")
    assert {(r["backend"], r["rounding_model"], r["status"]) for r in recs} == {
        ("toy-good", "exact", "pass"), ("toy-bf16-x", "bf16-x", "pass")}


def test_abort_in_some_cells_is_a_crash_and_the_rest_are_kept_then_resume_completes(tmp_path):
    kl("conform", "--family", "toy", "--tier", "ci", "--backend", "toy-abort", "--out", str(tmp_path),
       "--jobs", "2", check_rc=1)
    recs = records.read(tmp_path / "cells.jsonl")
    assert len(recs) == 12
    by_n = {r["params"]["n"]: r for r in recs}
    for n, r in by_n.items():
        assert r["status"] == ("crash" if n % 2 else "pass"), r
    assert all("SIGABRT" in r["reason"] for r in recs if r["status"] == "crash")
    # an interrupted run: drop the last 5 records, then --resume completes exactly those
    path = tmp_path / "cells.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-5]))
    kl("conform", "--family", "toy", "--tier", "ci", "--backend", "toy-abort", "--out", str(tmp_path),
       "--resume", check_rc=1)
    again = records.read(path)
    assert len(again) == 12 and len({records.key(r) for r in again}) == 12
    assert lines[:-5] == path.read_text().splitlines(keepends=True)[:7]


def test_two_shards_merged_equal_the_unsharded_run(tmp_path):
    common = ["conform", "--family", "toy", "--tier", "ci", "--backend", "toy-good,toy-wrong"]
    kl(*common, "--out", str(tmp_path / "all"), check_rc=1)
    kl(*common, "--shard", "1/2", "--out", str(tmp_path / "s1"), check_rc=1)
    kl(*common, "--shard", "2/2", "--out", str(tmp_path / "s2"), check_rc=1)
    # exit 1 like the unsharded run: toy-wrong fails
    kl("merge", "--out", str(tmp_path / "merged"), str(tmp_path / "s1"), str(tmp_path / "s2"), check_rc=1)
    assert statuses(tmp_path / "merged") == statuses(tmp_path / "all")
    assert statuses(tmp_path / "s1").keys().isdisjoint(statuses(tmp_path / "s2").keys())


@pytest.mark.parametrize("args, words", [
    (["--backend", "nope"], "unknown backend"),
    (["--family", "nope"], "unknown family"),
    (["--op", "nope"], "unknown op"),
    (["--tier", "nope"], "unknown tier"),
    (["--filter", "(["], "not a valid regular expression"),
    (["--shard", "3/2"], "--shard"),
    (["--shard", "x"], "--shard"),
    (["--out", "/proc/kernel-lab-cannot-write"], "not writable"),
])
def test_bad_requests_exit_2_with_one_line(tmp_path, args, words):
    base = ["conform", "--family", "toy", "--tier", "smoke", "--out", str(tmp_path / "o")]
    res = kl(*base, *args, check_rc=2)
    assert words in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_half_written_last_line_is_dropped_on_resume_with_a_warning(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good", "--out", str(tmp_path),
       check_rc=0)
    path = tmp_path / "cells.jsonl"
    whole = path.read_text().splitlines(keepends=True)
    path.write_text("".join(whole[:2]) + whole[2][:-20])
    res = kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good", "--out",
             str(tmp_path), "--resume", check_rc=0)
    assert "dropped a half-written last line" in res.stderr and "line 3" in res.stderr
    again = path.read_text().splitlines(keepends=True)
    assert again[:2] == whole[:2] and len(records.read(path)) == 3


def test_report_and_list_cells(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good,toy-wrong", "--out",
       str(tmp_path), check_rc=1)
    kl("report", str(tmp_path), check_rc=0)
    text = (tmp_path / "summary.md").read_text()
    assert "## Failures (3)" in text and "toy-wrong" in text
    res = kl("list-cells", "--family", "toy", check_rc=0)
    assert "smoke: 3 cells" in res.stdout and "ci: 12 cells" in res.stdout


def test_known_failures_are_xfail_an_unexpected_pass_is_xpass_and_unsupported_cells_skip(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend",
       "toy-wrong-known,toy-good-marked,toy-unsupported", "--out", str(tmp_path), check_rc=1)
    recs = records.read(tmp_path / "cells.jsonl")
    by = {(r["backend"], r["params"]["n"]): r for r in recs}
    assert {by["toy-wrong-known", n]["status"] for n in (8, 9, 10)} == {"xfail"}
    assert {by["toy-good-marked", n]["status"] for n in (8, 9, 10)} == {"xpass"}
    assert by["toy-unsupported", 8]["status"] == "pass"
    assert by["toy-unsupported", 9]["status"] == "skip" and by["toy-unsupported", 9]["reason"] == "only n < 9"
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-wrong-known", "--out",
       str(tmp_path / "only-xfail"), check_rc=0)
