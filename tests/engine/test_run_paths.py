"""The code path in every record (schema version 2): what a run reported it took, a skip's
declared path, a folder of version 1 (records without paths) resumed as it is, and one of a newer
version refused."""
import json
import shutil

import pytest

from conformance.errors import UsageError
from conformance.run import records, run_folder, schema
from reports import build
from tests.engine.test_runner import kl

BACKENDS = "toy-path,toy-good,toy-absent"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("paths") / "run"
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", BACKENDS, "--out", str(out), check_rc=0)
    return out


def test_records_hold_the_path_taken_or_declared_and_run_json_the_schema_version(run_dir):
    got = {(r["backend"], r["params"]["n"]): (r["status"], r["path"]) for r in records.read(run_dir / "cells.jsonl")}
    # smoke: n = 8, 9, 10; toy-path takes toy-even / toy-odd, skips n = 10 on its declared path
    assert {k: v for k, v in got.items() if k[0] == "toy-path"} == {
        ("toy-path", 8): ("pass", "toy-even"), ("toy-path", 9): ("pass", "toy-odd"),
        ("toy-path", 10): ("skip", "toy-declared")}
    # no path declared: "unknown", run or skipped (unavailable)
    assert {v for k, v in got.items() if k[0] != "toy-path"} == {("pass", "unknown"), ("skip", "unknown")}
    assert json.loads((run_dir / "run.json").read_text())["schema"] == schema.VERSION == 3


def test_a_version_1_folder_resumes_as_it_is_and_a_newer_one_is_refused(run_dir, tmp_path):
    old_dir = tmp_path / "old"
    shutil.copytree(run_dir, old_dir)
    # as an older kernel-lab wrote it: no schema in run.json, no path in the records; toy-path's n = 8 unrecorded
    info = json.loads((old_dir / "run.json").read_text())
    del info["schema"]
    (old_dir / "run.json").write_text(json.dumps(info))
    old = [{k: v for k, v in r.items() if k != "path"} for r in records.read(old_dir / "cells.jsonl")
           if (r["backend"], r["params"]["n"]) != ("toy-path", 8)]
    (old_dir / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", BACKENDS, "--out", str(old_dir), "--resume",
       check_rc=0)
    recs = records.read(old_dir / "cells.jsonl")
    assert recs[:-1] == old and (recs[-1]["backend"], recs[-1]["params"]["n"], recs[-1]["path"]) == (
        "toy-path", 8, "toy-even")
    info = json.loads((old_dir / "run.json").read_text())
    assert schema.version(info) == 1
    summary = build.write([str(old_dir)], str(tmp_path / "report")).summary.read_text()
    assert "| toy-path | not recorded | 1 | 1 | 0 | 1 | 1x only n &lt; 10 |" in summary
    assert "| toy-path | toy-even | 1 | 1 | 0 | 0 |  |" in summary
    # a folder of a newer version than this kernel-lab's is refused on resume
    (old_dir / "run.json").write_text(json.dumps({**info, "schema": schema.VERSION + 1}))
    with pytest.raises(UsageError, match=f"schema version {schema.VERSION + 1}, newer than this kernel-lab's"):
        run_folder.previous_records(old_dir, info["selection"], True, print)
