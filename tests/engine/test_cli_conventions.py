"""The CLI behaves as command-line tools do: --version, a help that lists every command, no
traceback when the reader of a pipe goes away, one line on Ctrl-C saying what is kept and how to
continue; a run where nothing ran has its own exit status; the repro command runs again and again
(a fresh folder each time) and is quoted for a POSIX shell; control characters never reach a record.
Real subprocesses, on the toy family."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.cells import make_cell
from conformance.registry import Backend, validate
from conformance.run import records
from conformance.run import repro
from tests.engine.toy_cli import TOY, lab

ROOT = Path(__file__).resolve().parents[2]


def test_version_and_a_help_that_lists_every_command():
    v = lab("--version")
    assert v.returncode == 0 and v.stdout.startswith("kernel-lab ")
    for bare in (lab(), lab("--help")):
        for command in ("doctor", "conform", "merge", "list-cells", "report", "study", "plan-blocks", "flydsl", "bench"):
            assert f"    {command}" in bare.stdout, command
        assert "Exit status:" in bare.stdout and "5 nothing ran" in bare.stdout
    assert lab().returncode == 2


@pytest.mark.parametrize("args", [["doctor"], ["list-cells", "--ids"]])
def test_a_closed_pipe_ends_quietly(args):
    env = {**os.environ, **TOY, "PYTHONPATH": str(ROOT)}
    cmd = shlex.join([sys.executable, "-m", "kernel_lab", *args])
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} | head -1"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert done.returncode in (0, 141)


def test_ctrl_c_prints_one_line_with_the_records_kept_and_the_resume_command(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, **TOY, "PYTHONPATH": str(ROOT)}
    args = ["conform", "--family", "toy", "--tier", "ci", "--backend", "toy-good,toy-hang", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lab", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env, start_new_session=True,
                            # as a terminal's foreground job: a shell's background job (`make test-long &`)
                            # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ((out / "cells.jsonl").exists() and (out / "cells.jsonl").read_text()):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)   # the terminal's Ctrl-C reaches the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.startswith("kernel-lab: interrupted")]
    assert len(lines) == 1 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    kept = len(records.read_partial(out / "cells.jsonl")[0])
    assert f"{kept} records kept" in lines[0] and kept >= 1
    again = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert again[0] == "kernel-lab" and again[-3:] == ["--out", str(out), "--resume"]
    assert not (out / ".kernel-lab.lock").exists()
    # the printed command itself continues the run (toy-hang's pairs time out: crash records, status 1)
    done = lab(*again[1:], "--timeout", "1")
    assert done.returncode == 1 and "already recorded" in done.stderr, done.stderr


def test_a_run_where_nothing_ran_exits_5_unless_allowed(tmp_path):
    args = ["conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-absent"]
    nothing = lab(*args, "--out", tmp_path / "a")
    assert nothing.returncode == 5 and "nothing ran" in nothing.stderr
    allowed = lab(*args, "--out", tmp_path / "b", "--allow-nothing-ran")
    assert allowed.returncode == 0 and "allowed by --allow-nothing-ran" in allowed.stderr
    some = lab("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-absent,toy-good", "--out", tmp_path / "c")
    assert some.returncode == 0


def test_a_repro_command_runs_any_number_of_times_and_selects_its_cell(tmp_path):
    first = lab("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-good", "--out", tmp_path / "run")
    assert first.returncode == 0
    rec = json.loads((tmp_path / "run" / "cells.jsonl").read_text().splitlines()[0])
    argv = shlex.split(repro.command(rec["id"], rec["backend"], "smoke"))
    outs = []
    for _ in range(2):   # twice from the same folder: each run gets a fresh folder of its own
        done = lab(*argv[1:], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout.split("records: ")[1].split()[0])
        assert [json.loads(x)["id"] for x in Path(tmp_path / outs[-1]).read_text().splitlines()] == [rec["id"]]
    assert outs[0] != outs[1]
    resume = lab("conform", "--family", "toy", "--tier", "smoke", "--resume", cwd=tmp_path)
    assert resume.returncode == 2 and "--out DIR" in resume.stderr


@pytest.mark.parametrize("text", ["a'b c", "x;rm -rf /", "$(touch pwned)", "tab\there", "é"])
def test_repro_arguments_survive_a_posix_shell(text, tmp_path):
    cmd = repro.command(f"toy/scale/n={text}/seed=0", "toy-good", "smoke")
    done = subprocess.run(["sh", "-c", f"printf '%s\\n' {cmd.split(' ', 2)[2]}"], capture_output=True, text=True,
                          cwd=tmp_path)
    args = done.stdout.splitlines()
    assert args[args.index("--filter") + 1] == repro.cell_pattern(f"toy/scale/n={text}/seed=0")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("bad", ["a\nb", "esc\x1b[31m", "nul\x00", "del\x7f", "c1\x85"])
def test_control_characters_are_refused_in_cell_ids_backend_names_and_records(bad, tmp_path):
    with pytest.raises(ValueError, match="control characters"):
        make_cell("toy", "scale", n=bad)
    with pytest.raises(ValueError, match="control characters"):
        validate(Backend(f"toy-{bad}", {"toy": ("scale",)}, lambda: (True, ""), lambda c, i: {}))
    w = records.Writer(tmp_path / "cells.jsonl")
    with pytest.raises(records.RecordsError, match="record id"):
        w.write({"id": f"toy/scale/n={bad}", "backend": "b", "status": "pass"})
    w.close()
    assert (tmp_path / "cells.jsonl").read_text() == ""


def test_text_tables_fit_their_longest_cell():
    """The gates table once had a fixed 44-column gate name; regression gates' names overflowed it
    and shifted every column after them."""
    from bench import gates

    def res(name, ratio):
        return {"gate": name, "ratio": ratio, "threshold": 1.3, "direction": "<=", "verdict": "pass",
                "spread": [ratio, ratio], "reason": ""}
    text = gates.table([res("regress:gdn/decode/state=bfloat16/act=float16/vllm-cpu-and-more", 1.0234),
                        res("short", 12.5)])
    lines = [ln for ln in text.splitlines() if "pass" in ln]
    ends = {ln.index(" <= 1.3") for ln in lines}
    assert len(lines) == 2 and len(ends) == 1 and "1.023" in lines[0] and "12.500" in lines[1]


def test_the_gates_table_reads_a_gate_that_fails_every_aa_run_as_an_unmet_target():
    from bench import gates

    res = {"gate": "g", "ratio": 0.7, "threshold": 0.8, "direction": ">=", "verdict": "fail", "spread": [0.6, 0.7],
           "reason": ""}
    assert "fail: unmet target" in gates.table([{**res, "false_alarm_rate": "40/40"}])
    assert "unmet" not in gates.table([{**res, "false_alarm_rate": "2/40"}])
    assert [gates.reading(r) for r in ("0/40", "2/40", "40/40", "not measured")] == [
        "quiet", "noisy", "unmet target", "not measured"]
