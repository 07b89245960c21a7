"""compute-sanitizer over our GPU backends (conformance/run/gpu_sanitizer.py): the passes and their
command lines, the reports it recognises, a report in a worker's output making the pair an error,
and the driver end to end with a stand-in for the sanitizer (the real one needs an NVIDIA GPU)."""
import stat
import sys
from pathlib import Path

import pytest

from conformance import registry
from conformance.run import gpu_sanitizer as gs
from conformance.run import records
from tests.engine.test_runner import kl

ROOT = Path(__file__).resolve().parents[2]
MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at _grouped_decode_kernel+0x1a30
=========     by thread (64,0,0) in block (3,1,0)
=========     Address 0x7f0c00000400 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cuStreamSynchronize.
========= ERROR SUMMARY: 2 errors
"""
RACECHECK = """========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at _chunk_kernel+0x50
=========     and Write access at _chunk_kernel+0x90 [16 hazards]
========= Error: Race reported between Write access at _chunk_kernel+0x60
=========     and Write access at _chunk_kernel+0x60 [4 hazards]
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
========= ERROR SUMMARY: 1 error
"""


def test_every_gpu_backend_is_sanitized_or_says_why_not():
    gpu = {n for n, b in registry.builtin().items() if b.uses_gpu}
    assert set(gs.SANITIZED) <= gpu and not set(gs.SANITIZED) & set(gs.NOT_SANITIZED)
    assert gpu - set(gs.SANITIZED) <= set(gs.NOT_SANITIZED), gpu - set(gs.SANITIZED) - set(gs.NOT_SANITIZED)
    assert set(gs.RACECHECK) <= set(gs.SANITIZED)


def test_passes_and_their_command_lines(tmp_path):
    ps = gs.passes()
    assert [p.name for p in ps if p.tool == "memcheck" and p.long is None] == [f"memcheck-{b}" for b in gs.SANITIZED]
    assert {p.backend for p in ps if p.tool == "racecheck"} == set(gs.RACECHECK)
    assert {p.name.rsplit("-", 1)[0] for p in ps if p.long is not None} == {
        "memcheck-triton-gdn-long", "memcheck-triton-gdn-sm90-long", "racecheck-triton-gdn-sm90-long"}
    gdn = next(p for p in ps if p.name == "racecheck-triton-gdn")
    out = tmp_path / gdn.name
    assert gs.command(gdn, out, "full", ["--jobs", "2"], python="python3") == [
        "compute-sanitizer", "--tool", "racecheck", "--target-processes", "all", "--require-cuda-init", "no",
        "--log-file", f"{out}/sanitizer-%p.log", "python3", "-m", "kernel_lab", "conform", "--tier", "full",
        "--backend", "triton-gdn", "--out", str(out), "--family", "gdn", "--op", "chunked", "--jobs", "2"]
    out.mkdir()
    (out / "cells.jsonl").write_text("")
    assert "--resume" in gs.command(gdn, out, "full")   # a pass cut short continues
    mem = gs.command(gs.Pass("memcheck", "triton-sm90"), tmp_path / "m", "full")
    assert mem[:3] == ["compute-sanitizer", "--tool", "memcheck"] and "--family" not in mem and "--resume" not in mem
    assert gs.passes(("racecheck",), ("triton", "triton-sm90")) == [gs.Pass("racecheck", "triton-sm90")]


def test_long_chains_are_checked_apart_each_in_a_worker_on_its_first_launches(tmp_path):
    from conformance.run.estimate import cell_calls
    from conformance.run.selection import select_cells

    tier = {c.id: c for c in select_cells("full")}
    main, *long = gs.passes(("racecheck",), ("triton-gdn-sm90",))
    ids = lambda p: {c.id for c in select_cells("full", pattern=p.filter)}  # noqa: E731
    assert main.name == "racecheck-triton-gdn-sm90" and main.long is None
    assert [p.name for p in long] == [f"racecheck-triton-gdn-sm90-long-{n}" for n in range(len(long))]
    assert all(len(ids(p)) == 1 for p in long)
    chains = set().union(*map(ids, long))
    longest = {i for i in tier if tier[i].op == "decode" and cell_calls(tier[i]) > gs.LONG_CALLS}
    skipped = {i for i in longest if registry.get("triton-gdn-sm90").skip_reason(tier[i])}
    assert skipped and chains == longest - skipped   # a chain the backend skips gets no session of its own
    assert len(chains) == len(long) > 1 and not ids(main) & chains and ids(main) | chains == set(tier)
    cmd = gs.command(long[0], tmp_path, "full", ["--jobs", "14"], python="py")
    assert cmd[cmd.index("--launch-count") + 1] == str(gs.CHECKED_LAUNCHES) and cmd[-2:] == ["--jobs", "1"]
    assert "--launch-count" not in gs.command(main, tmp_path, "full", python="py")
    assert [[p.name for p in g] for g in gs.side_by_side([main, *long])] == [[main.name], [p.name for p in long]]
    # a --filter of the caller's is kept by every pass; a pass it leaves empty is not run
    main, *long = gs.passes(("memcheck",), ("triton-gdn",), pattern="state=float16")
    assert not ids(main) & set().union(*map(ids, long))
    assert ids(main).union(*map(ids, long)) == {i for i in tier if "state=float16" in i}
    assert [p.name for p in gs.passes(("memcheck",), ("triton-gdn",), pattern="steps=16384")] == [
        f"memcheck-triton-gdn-long-{n}" for n in range(3)]
    assert gs.passes(("racecheck",), ("triton-gdn",)) == [gs.Pass("racecheck", "triton-gdn", "gdn", "chunked")]
    assert gs.conform_filter(["--jobs", "2", "--filter", "a|b"]) == ("a|b", ["--jobs", "2"])
    assert gs.conform_filter(["--filter=x", "--timeout", "9"]) == ("x", ["--timeout", "9"])


def test_the_table_says_why_a_pass_reports_nothing():
    def row(name, statuses, cut=False):
        return gs.Outcome(name, "memcheck", None if cut else 0, statuses, 0, None, [])

    text = " ".join(gs.table([row("skips", {"skip": 2}), row("empty", {}), row("cut", {"pass": 1, "skip": 3}, True),
                              row("clean", {"pass": 2})]).split())
    assert "skips memcheck 0 0 0 nothing ran: every record a skip (cells.jsonl says why)" in text
    assert "empty memcheck 0 0 0 no record: conform ended before its first (its output says why)" in text
    assert "cut memcheck 1 0 0 stopped at the time limit after 1 pair(s)" in text
    assert text.endswith("clean memcheck 2 0 0")


def test_reports_are_recognised_and_counted():
    assert gs.report_in(MEMCHECK) == "Invalid __global__ read of size 2 bytes" and gs.count_errors(MEMCHECK) == 2
    assert gs.report_in(RACECHECK).startswith("Error: Race reported between Write access") and gs.count_errors(RACECHECK) == 1
    clean = "========= COMPUTE-SANITIZER\nhello\n========= ERROR SUMMARY: 0 errors\n"
    assert gs.report_in(clean) is None and gs.count_errors(clean) == 0
    warned = RACECHECK.replace("========= Error: Race", "========= Warning: Race").replace("1 error\n", "0 errors\n")
    assert gs.report_in(warned) is None and gs.count_errors(warned) == 0
    # a session killed before its summary still counts its reports
    assert gs.count_errors(MEMCHECK.rsplit("========= ERROR SUMMARY", 1)[0]) == 2
    assert gs.report_in("") is None and gs.report_in(None) is None


def test_a_report_in_a_workers_output_makes_the_pair_an_error(tmp_path):
    kl("conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-sanitizer-report", "--out", str(tmp_path),
       check_rc=1)
    recs = records.read(tmp_path / "cells.jsonl")
    assert recs and {r["status"] for r in recs} == {"pass", "error"}
    for r in recs:
        if r["params"]["n"] % 2:
            assert r["status"] == "error" and r["reason"].startswith(
                "compute-sanitizer: Invalid __global__ write of size 4 bytes (the check said pass")
            assert "toy_kernel+0x70" in r["output"]
        else:
            assert r["status"] == "pass" and "output" not in r


FAKE = """#!/bin/sh
# a stand-in for compute-sanitizer: writes a log as it would, with FAKE_ERRORS reports, and runs the command
while [ "$1" != "--log-file" ]; do shift; done
log=$(echo "$2" | sed "s/%p/$$/"); shift 2
echo "========= COMPUTE-SANITIZER" > "$log"
for i in $(seq 1 ${FAKE_ERRORS:-0}); do echo "========= Invalid __global__ write of size 4 bytes" >> "$log"; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: ${FAKE_ERRORS:-0} errors" >> "$log"
exit $rc
"""


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "compute-sanitizer"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(ROOT)
    return str(path)


def test_driver_runs_each_pass_keeps_its_log_and_fails_on_a_sanitizer_error(tmp_path, fake_sanitizer, monkeypatch, capsys):
    out = tmp_path / "san"
    args = ["--out", str(out), "--sanitizer", fake_sanitizer, "--backend", "triton-gdn", "--",
            "--filter", "gdn/decode/.*N=1/|gdn/chunked/.*lens=64/"]
    assert gs.main(args) == 0   # no GPU here: every pair a skip, nothing ran, no report
    printed = capsys.readouterr().out
    assert f"$ {fake_sanitizer} --tool memcheck --target-processes all" in printed
    assert f"$ {fake_sanitizer} --tool racecheck" in printed and "--op chunked" in printed
    logs = sorted((out / "memcheck-triton-gdn").glob("sanitizer-*.log"))
    assert len(logs) == 1 and (out / "memcheck-triton-gdn" / "cells.jsonl").exists()
    monkeypatch.setenv("FAKE_ERRORS", "3")
    assert gs.main(args) == 1   # the same folder continued (--resume), and its log reports 3 errors
    printed = capsys.readouterr().out
    assert "--resume" in printed
    assert len(list((out / "memcheck-triton-gdn").glob("sanitizer-*.log"))) == 2
    row = next(line for line in printed.splitlines() if "triton-gdn" in line and "memcheck" in line
               and not line.startswith("$"))
    assert " 3 " in row and "Invalid __global__ write of size 4 bytes" in row
    # the long chains: a session each, side by side, each printing into its folder
    monkeypatch.delenv("FAKE_ERRORS")
    args = ["--out", str(tmp_path / "long"), "--sanitizer", fake_sanitizer, "--backend", "triton-gdn", "--tool",
            "memcheck", "--", "--filter", "steps=16384", "--jobs", "4"]
    assert gs.main(args) == 0
    printed = capsys.readouterr().out
    folders = sorted((tmp_path / "long").iterdir())
    assert [f.name for f in folders] == [f"memcheck-triton-gdn-long-{n}" for n in range(3)]
    for f in folders:
        assert (f / "cells.jsonl").exists() and len(list(f.glob("sanitizer-*.log"))) == 1
        assert "nothing ran" in (f / "conform.log").read_text()   # the conform's own lines, in its folder
        assert f"--launch-count {gs.CHECKED_LAUNCHES} --log-file {f}/" in printed
    assert printed.count("memcheck, first 256 launches") == 3


def test_driver_refuses_unknown_names_and_a_missing_sanitizer(tmp_path, capsys):
    assert gs.main(["--out", str(tmp_path), "--backend", "fla"]) == 2
    assert "unknown tool or backend fla" in capsys.readouterr().err
    true = "/bin/true"
    assert gs.main(["--out", str(tmp_path), "--sanitizer", true, "--", "--filter", "zzz"]) == 2
    assert "--filter zzz: matches no cell of the full tier" in capsys.readouterr().err
    assert gs.main(["--out", str(tmp_path), "--sanitizer", true, "--", "--filter", "("]) == 2
    assert "is not a valid regular expression" in capsys.readouterr().err
    assert gs.main(["--out", str(tmp_path), "--sanitizer", str(tmp_path / "none")]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def test_a_pass_past_the_time_limit_is_interrupted(tmp_path):
    import time

    start = time.monotonic()
    assert gs.run_until([[sys.executable, "-c", "import time; time.sleep(60)"]], start + 1.0) == [None]
    assert time.monotonic() - start < 20
    assert gs.run_until([[sys.executable, "-c", "raise SystemExit(3)"]], float("inf")) == [3]
    # passes side by side, each printing to its own file: those past the limit stopped together
    logs = [tmp_path / f"{i}.log" for i in range(3)]
    cmds = [[sys.executable, "-c", f"import time; print('pass {i}', flush=True); time.sleep({s})"]
            for i, s in enumerate((0, 60, 60))]
    start = time.monotonic()
    assert gs.run_until(cmds, start + 3.0, logs) == [0, None, None]
    assert time.monotonic() - start < 20
    assert [log.read_text().splitlines()[0] for log in logs] == [f"pass {i}" for i in range(3)]
    assert all("KeyboardInterrupt" in log.read_text() for log in logs[1:])   # interrupted, as Ctrl-C


def test_passes_past_the_time_limit_are_stopped_together(monkeypatch):
    """Two passes that ignore the interrupt are killed after one grace, not one grace each."""
    import time

    monkeypatch.setattr(gs, "STOP_GRACE_S", 3.0)
    deaf = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"]
    start = time.monotonic()
    assert gs.run_until([deaf, deaf], start + 1.0) == [None, None]
    assert time.monotonic() - start < 1.0 + 2 * gs.STOP_GRACE_S   # one after the other: 7 s at least


@pytest.mark.parametrize("ignores_interrupt", [False, True])
def test_a_pass_stopped_at_the_time_limit_leaves_no_process_that_left_its_group(tmp_path, monkeypatch,
                                                                               ignores_interrupt):
    """The pass's process starts a child in a session of its own (outside the group the stop signals,
    as a sanitizer may run its target) and sleeps: the stop reaches the child too, by its interrupt or,
    where it ignores it, by a kill after the grace; none is left to hold the run folder."""
    import time

    from conformance.run import processes

    monkeypatch.setattr(gs, "STOP_GRACE_S", 1.0)
    pid_file = tmp_path / "child.pid"
    child = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)" if ignores_interrupt
             else "import time; time.sleep(60)")
    parent = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child!r}], "
              f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    start = time.monotonic()
    assert gs.run_until([[sys.executable, "-c", parent]], start + 3.0) == [None]
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while processes.pid_running(pid) and time.monotonic() < deadline:   # a kill lands within moments
        time.sleep(0.05)
    assert not processes.pid_running(pid)
    assert time.monotonic() - start < 20

