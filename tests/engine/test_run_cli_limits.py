"""CLI limits and merge checks: an empty --out never means the current folder; --jobs is bounded
by the machine; a --filter that backtracks catastrophically is stopped and named; a backend that
prints megabytes stays out of the console (its record holds the start); merge refuses shards whose
records disagree with their own run.json or lie outside their selection, and exits 1 when the
merged records fail."""
import json

import pytest

from conformance import patterns
from conformance.run import records
from kernel_lab import cli
from tests.engine.test_run_folders import SMOKE, main, one_error_line, toy_lab  # noqa: F401


@pytest.mark.parametrize("argv", [[*SMOKE, "--backend", "toy-good", "--out", ""],
                                  ["merge", "--out", "", "shard"], ["report", "shard", "--out", ""]])
def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shard").mkdir()
    rc, _, err = main(capsys, *argv)
    assert rc == 2 and "--out: empty" in one_error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"] and not any((tmp_path / "shard").iterdir())


def test_jobs_are_bounded_by_the_machine(tmp_path, capsys):
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good", "--jobs", "100000", "--out", tmp_path / "o")
    line = one_error_line(err)
    assert rc == 2 and f"--jobs 100000: expected 1 to {cli.max_jobs()} worker processes" in line
    assert not (tmp_path / "o").exists()


def test_a_catastrophically_backtracking_filter_is_stopped_and_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(patterns, "TIME_LIMIT_S", 1.0)
    rc, _, err = main(capsys, *SMOKE, "--backend", "toy-good", "--filter", "^(.|.)*!", "--out", tmp_path / "o")
    assert rc == 2 and "catastrophic backtracking" in one_error_line(err) and "'^(.|.)*!'" in err
    rc, out, _ = main(capsys, "list-cells", "--tier", "smoke", "--family", "toy", "--filter", "n=(8|9)/", "--ids")
    assert rc == 0 and len(out.split()) == 2


def test_a_backend_printing_megabytes_stays_out_of_the_console(tmp_path, capsys):
    rc, out, err = main(capsys, *SMOKE, "--backend", "toy-chatty", "--out", tmp_path)
    assert rc == 0 and len(out) + len(err) < 10_000
    for r in records.read(tmp_path / "cells.jsonl"):
        assert r["status"] == "pass" and r["output"].startswith("xxx") and "more characters cut" in r["output"]


def _shards(tmp_path, capsys, backend="toy-good"):
    for k in (1, 2):
        rc, _, err = main(capsys, *SMOKE, "--backend", backend, "--shard", f"{k}/2", "--out", tmp_path / f"s{k}")
        assert rc in (0, 1), err
    return tmp_path / "s1", tmp_path / "s2"


def test_merge_exits_1_when_the_merged_records_fail(tmp_path, capsys):
    s1, s2 = _shards(tmp_path, capsys, "toy-wrong")
    rc, out, _ = main(capsys, "merge", "--out", tmp_path / "m", s1, s2)
    assert rc == 1 and len(records.read(tmp_path / "m" / "cells.jsonl")) == 3


def _set_counts(folder, recs):
    info = json.loads((folder / "run.json").read_text())
    info["counts"] = {}
    for r in recs:
        by = info["counts"].setdefault(r["backend"], {})
        by[r["status"]] = by.get(r["status"], 0) + 1
    (folder / "run.json").write_text(json.dumps(info))


@pytest.mark.parametrize("edit", ["dropped", "counts", "foreign id", "other shard's pair", "other backend"])
def test_merge_refuses_shards_whose_records_disagree_with_their_run_json(tmp_path, capsys, edit):
    s1, s2 = _shards(tmp_path, capsys)
    one, two = records.read(s1 / "cells.jsonl"), records.read(s2 / "cells.jsonl")
    if edit == "dropped":
        recs = one[:-1]
    elif edit == "counts":
        recs = [{**one[0], "status": "fail",
                 "outputs": {k: {**m, "passed": False} for k, m in one[0]["outputs"].items()}}] + one[1:]
    elif edit == "foreign id":
        recs = one + [{**one[0], "id": "toy/scale/n=99/factor=1.0/seed=0", "params": {"n": 99, "factor": 1.0}}]
    elif edit == "other shard's pair":
        recs, two = one + two[:1], two[1:]
        (s2 / "cells.jsonl").unlink()
        records.write_all(s2 / "cells.jsonl", two)
        _set_counts(s2, two)
    else:
        recs = one + [{**one[0], "backend": "toy-wrong"}]
    (s1 / "cells.jsonl").unlink()
    records.write_all(s1 / "cells.jsonl", recs)
    if edit != "dropped" and edit != "counts":
        _set_counts(s1, recs)
    rc, _, err = main(capsys, "merge", "--out", tmp_path / "m", s1, s2)
    line = one_error_line(err)
    assert rc == 2 and str(s1) in line and not (tmp_path / "m").exists()
    assert ("does not hold what its run.json counts" in line) == (edit in ("dropped", "counts"))
    assert ("outside the shard's selection" in line) == (edit not in ("dropped", "counts"))
