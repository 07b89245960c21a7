"""The code path in every record (schema version 2): what a run reported it took, a skip's
declared path, a folder of version 1 (records without paths) resumed as it is, and one of a newer
version refused."""
import json

from conformance import records, schema
from tests.engine.test_runner import kl


def test_records_hold_the_path_taken_or_declared_and_run_json_the_schema_version(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-path,toy-good,toy-absent",
       "--out", str(tmp_path), check_rc=0)
    recs = records.read(tmp_path / "cells.jsonl")
    got = {(r["backend"], r["params"]["n"]): (r["status"], r["path"]) for r in recs}
    # smoke: n = 8, 9, 10; toy-path takes toy-even / toy-odd, skips n = 10 on its declared path
    assert {k: v for k, v in got.items() if k[0] == "toy-path"} == {
        ("toy-path", 8): ("pass", "toy-even"), ("toy-path", 9): ("pass", "toy-odd"),
        ("toy-path", 10): ("skip", "toy-declared")}
    # no path declared: "unknown", run or skipped (unavailable)
    assert {v for k, v in got.items() if k[0] != "toy-path"} == {("pass", "unknown"), ("skip", "unknown")}
    assert json.loads((tmp_path / "run.json").read_text())["schema"] == schema.VERSION == 2


def test_a_version_1_folder_resumes_as_it_is_and_its_report_says_not_recorded(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-path", "--out", str(tmp_path), check_rc=0)
    # as an older kernel-lab wrote it: no schema in run.json, no path in the records; the last pair unrecorded
    info = json.loads((tmp_path / "run.json").read_text())
    del info["schema"]
    (tmp_path / "run.json").write_text(json.dumps(info))
    old = [{k: v for k, v in r.items() if k != "path"} for r in records.read(tmp_path / "cells.jsonl")]
    old = sorted(old, key=lambda r: r["params"]["n"])
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old[:2]))
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-path", "--out", str(tmp_path),
       "--resume", check_rc=0)
    recs = records.read(tmp_path / "cells.jsonl")
    assert recs[:2] == old[:2] and recs[2]["path"] == "toy-declared" and len(recs) == 3
    assert schema.version(json.loads((tmp_path / "run.json").read_text())) == 1
    kl("report", str(tmp_path), check_rc=0)
    summary = (tmp_path / "summary.md").read_text()
    assert "| toy-path | not recorded | 2 | 2 | 0 | 0 |  |" in summary
    assert "| toy-path | toy-declared | 0 **no cell ran** | 0 | 0 | 1 | 1x only n &lt; 10 |" in summary

    # a folder of a newer version than this kernel-lab's is refused on resume
    info = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**info, "schema": schema.VERSION + 1}))
    res = kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-path", "--out", str(tmp_path),
             "--resume", check_rc=2)
    assert f"schema version {schema.VERSION + 1}, newer than this kernel-lab's {schema.VERSION}" in res.stderr
