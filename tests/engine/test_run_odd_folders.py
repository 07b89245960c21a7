"""Odd run folders given to `report`, `merge` and `conform --resume`: fields of the wrong type,
JSON nested thousands deep, a FIFO where a file should be, an odd `--out`. Each is one line naming
the file (and the line of cells.jsonl), exit 2, never a traceback, never a hang (an alarm fails a
command that blocks)."""
import json
import os
import signal

import pytest

from conformance.run import records, run_folder, runner, schema
from tests.engine.test_run_folders import SMOKE, main, one_error_line, toy_lab  # noqa: F401

GOOD = {"id": "toy/scale/n=1/seed=0", "family": "toy", "op": "scale", "params": {"n": 1}, "seed": 0,
        "backend": "toy-good", "rounding_model": "exact", "status": "pass", "reason": "", "duration_s": 0.1}
DEEP = "[" * 100_000 + "]" * 100_000
NESTED_950 = '{"a": ' * 950 + "{}" + "}" * 950   # json.loads takes it (in a shallow stack); a reader recursing dies

BAD_RECORDS = {
    "id not a string": {**GOOD, "id": 5},
    "params a list": {**GOOD, "params": [1, 2]},
    "outputs a string": {**GOOD, "outputs": "o"},
    "metric a list": {**GOOD, "metrics": {"margin": [0.5]}},
    "duration a word": {**GOOD, "duration_s": "slow"},
    "duration the writer's nan": {**GOOD, "duration_s": "nan"},
    "duration negative": {**GOOD, "duration_s": -1.0},
    "margin a word": {**GOOD, "status": "fail", "metrics": {"margin": "big"}},
    "atol a word": {**GOOD, "tolerance": {"atol": "tight"}},
    "unknown field nested 950 deep": json.dumps(GOOD)[:-1] + ', "from_a_newer_version": ' + NESTED_950 + "}",
    "warnings a string": {**GOOD, "warnings": "w"},
    "unknown status": {**GOOD, "status": "maybe"},
    "no backend": {k: v for k, v in GOOD.items() if k != "backend"},
    "quality too deep": {**GOOD, "quality": {"q": json.loads("[" * 20 + "]" * 20)}},
    "a list, not an object": [GOOD],
    "nested 100000 deep": DEEP,
}
BAD_RUN_JSON = {
    "cpu flags a string": {"cpu": {"model": "x", "flags": "avx512f"}},
    "availability a word": {"backends": {"toy-good": {"available": "yes"}}},
    "selection a list": {"selection": ["smoke"]},
    "command a number": {"command": 5},
    "counts of words": {"counts": {"toy-good": {"pass": "many"}}},
    "elapsed the writer's inf": {"elapsed_s": "inf"},
    "unknown field nested 950 deep": '{"from_a_newer_version": ' + NESTED_950 + "}",
    "nested 100000 deep": DEEP,
}


@pytest.fixture(autouse=True)
def no_hang():
    """Fail a test whose command blocks (a FIFO opened for reading waits for a writer forever)."""
    def hung(signum, frame):
        raise TimeoutError("the command hung")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _shard(tmp_path):
    """A finished shard 1/1 of the toy smoke tier with one record."""
    run = tmp_path / "run"
    run.mkdir()
    records.write_all(run / "cells.jsonl", [GOOD])
    records.dump_json(run / "run.json", {"selection": runner.Selection("smoke", "toy", backends=("toy-good",),
                                                                       shard="1/1").as_dict(),
                                         "finished": "2026-12-01T00:00:00"})
    return run


def _argv(command, run, tmp_path):
    return {"conform": [*SMOKE, "--backend", "toy-good", "--shard", "1/1", "--out", run, "--resume"],
            "report": ["report", run, "--out", tmp_path / "report"],
            "merge": ["merge", "--out", tmp_path / "merged", run]}[command]


def _text(value) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except RecursionError:   # json.dumps recurses in Python: write the 950 levels by hand
        return json.dumps({k: v for k, v in value.items() if v is not NESTED_950})[:-1] + ", " + ", ".join(
            f'"{k}": ' + '{"a": ' * 950 + "{}" + "}" * 950 for k, v in value.items() if v is NESTED_950) + "}"


COMMANDS = ["conform", "report", "merge"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_record_off_the_schema_is_named_by_file_and_line(tmp_path, capsys, command, case):
    run = _shard(tmp_path)
    (run / "cells.jsonl").write_text(json.dumps(GOOD) + "\n" + _text(BAD_RECORDS[case]) + "\n")
    rc, _, err = main(capsys, *_argv(command, run, tmp_path))
    assert rc == 2 and f"{run / 'cells.jsonl'}:2: " in one_error_line(err)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(BAD_RUN_JSON))
def test_a_run_json_off_the_schema_is_named(tmp_path, capsys, command, case):
    run = _shard(tmp_path)
    (run / "run.json").write_text(_text(BAD_RUN_JSON[case]))
    rc, _, err = main(capsys, *_argv(command, run, tmp_path))
    assert rc == 2 and str(run / "run.json") in one_error_line(err)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", ["cells.jsonl", "run.json"])
def test_a_fifo_where_a_file_should_be_is_named_not_waited_on(tmp_path, capsys, command, name):
    run = _shard(tmp_path)
    (run / name).unlink()
    os.mkfifo(run / name)
    rc, _, err = main(capsys, *_argv(command, run, tmp_path))
    assert rc == 2 and f"{run / name}: is not a regular file" in one_error_line(err)


def test_the_schema_names_the_field_and_what_was_expected():
    assert schema.problem(GOOD, schema.RECORD) is None
    assert schema.problem(BAD_RECORDS["id not a string"], schema.RECORD) == "id: expected a string, found 5"
    assert schema.problem(BAD_RECORDS["metric a list"], schema.RECORD).startswith("metrics.margin: expected")
    assert schema.problem(BAD_RUN_JSON["availability a word"], schema.RUN_INFO) == \
        "backends.toy-good.available: expected true/false, found 'yes'"
    assert schema.problem({**GOOD, "metrics": {"margin": "nan"}}, schema.RECORD) is None  # the writer's NaN


@pytest.mark.parametrize("odd", ["a file", "a fifo inside", "below a file"])
def test_an_odd_report_out_is_one_line(tmp_path, capsys, odd):
    run = _shard(tmp_path)
    out = tmp_path / "out"
    if odd == "a file":
        out.write_text("")
    elif odd == "a fifo inside":
        out.mkdir()
        os.mkfifo(out / "index.html")
    else:
        (tmp_path / "f").write_text("")
        out = tmp_path / "f" / "out"
    rc, _, err = main(capsys, "report", run, "--out", out)
    assert rc == 2 and "--out" in one_error_line(err)


def test_a_fifo_where_the_lock_should_be_is_named_not_waited_on(tmp_path, capsys):
    run = _shard(tmp_path)
    os.mkfifo(run / run_folder.LOCK_NAME)
    rc, _, err = main(capsys, *_argv("conform", run, tmp_path))
    assert rc == 2 and f"{run / run_folder.LOCK_NAME}: is not a regular file" in one_error_line(err)


def test_a_run_json_field_nested_950_deep_is_one_line_on_resume_not_a_recursion_error(tmp_path):
    # in its own process, as a user runs it: json.loads takes 950 levels there, the schema must refuse them
    from tests.engine.test_runner import kl

    kl(*SMOKE, "--backend", "toy-good", "--out", str(tmp_path), check_rc=0)
    text = (tmp_path / "run.json").read_text().rstrip()
    (tmp_path / "run.json").write_text(text[:-1] + ', "from_a_newer_version": ' + NESTED_950 + "}\n")
    for argv in ([*SMOKE, "--backend", "toy-good", "--out", str(tmp_path), "--resume"],
                 ["report", str(tmp_path), "--out", str(tmp_path / "report")]):
        res = kl(*argv)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"kernel-lab: error: {tmp_path / 'run.json'}: not a valid run.json "
            f"(from_a_newer_version{'.a' * 9}: nested deeper than {schema.MAX_DEPTH} levels)"]


ESCAPES = "\x1b]0;retitled\x07\x1b[2J\x1b[31m\u2028\r"   # retitle, clear, colour, split the line


def test_ids_and_backends_with_escape_sequences_reach_the_console_escaped(tmp_path):
    # report's duplicate note and merge's errors, from `kernel-lab` in its own process as a terminal sees it
    from tests.engine.test_runner import kl

    rec = {**GOOD, "id": f"toy/scale/n={ESCAPES}/seed=0", "params": {"n": ESCAPES}, "backend": f"toy{ESCAPES}"}
    runs = []
    for k in (1, 2):
        run = tmp_path / f"s{k}"
        run.mkdir()
        (run / "cells.jsonl").write_text(json.dumps(rec) + "\n")
        records.dump_json(run / "run.json", {"selection": runner.Selection("smoke", "toy", shard=f"{k}/2").as_dict(),
                                             "finished": "2026-12-01T00:00:00", "counts": {}})
        runs.append(run)
    (runs[0] / "cells.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")   # recorded twice
    report = kl("report", str(runs[0]), "--out", str(tmp_path / "report"))
    merged = kl("merge", "--out", str(tmp_path / "merged"), *map(str, runs))
    for res in (report, merged):
        assert "\x1b" not in res.stderr and "\x07" not in res.stderr and "\u2028" not in res.stderr
        assert "\r" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert report.returncode == 0 and "on 'toy\\x1b]0;retitled\\x07\\x1b[2J\\x1b[31m\\u2028\\r' recorded twice" \
        in report.stderr
    assert merged.returncode == 2 and len(merged.stderr.splitlines()) == 1 and "\\x1b[2J" in merged.stderr
