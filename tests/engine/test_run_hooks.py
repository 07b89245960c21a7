"""A backend's hooks cannot stop a run: available() that hangs, raises or kills its process, and
supports() / xfail() that raise or answer nonsense, and supports() / path() that hang, segfault or
exit, become records (an error or a crash naming the hook, or the backend unavailable with the reason);
the probe and the hooks have a time limit; doctor does not hang; no lock is left. A stack that imports but cannot run (a tiny call of its kernels raises) is unavailable
before the run, with the versions found."""
import json
import os
import subprocess
import sys
import time

import pytest

from conformance import registry
from conformance.run import probe, records, run_folder, runner
from tests.engine.test_run_folders import ROOT, SMOKE, main, toy_lab  # noqa: F401
from tests.engine.test_runner import kl


def _conform(capsys, tmp_path, backend):
    start = time.monotonic()
    rc, out, err = main(capsys, *SMOKE, "--backend", backend, "--out", tmp_path)
    info = json.loads((tmp_path / "run.json").read_text())
    assert not (tmp_path / run_folder.LOCK_NAME).exists()
    assert "Traceback" not in err
    return rc, info, records.read(tmp_path / "cells.jsonl"), time.monotonic() - start


@pytest.mark.parametrize("backend,reason", [
    ("toy-avail-hangs", "did not answer within 2 s; killed"),
    ("toy-avail-raises", "available() raised RuntimeError: the driver is missing at toy_backends.py:"),
    ("toy-avail-aborts", "the probe process died (signal SIGABRT) in available()"),
])
def test_an_available_hook_that_hangs_raises_or_dies_makes_the_backend_unavailable(capsys, tmp_path, backend, reason):
    rc, info, recs, took = _conform(capsys, tmp_path, backend)
    assert info["backends"][backend]["available"] is False and reason in info["backends"][backend]["reason"]
    assert rc == runner.NOTHING_RAN and len(recs) == 3   # every pair a skip: nothing ran
    assert all(r["status"] == "skip" and r["unavailable"] == info["backends"][backend]["reason"]
               and r["reason"] == f"backend unavailable: {r['unavailable']}" for r in recs)
    assert took < 60


@pytest.mark.parametrize("backend,words", [
    ("toy-supports-raises", "toy-supports-raises: supports() raised KeyError: 'n'"),
    ("toy-supports-lies", "toy-supports-lies: supports() returned int, expected None or a reason"),
    ("toy-xfail-raises", "toy-xfail-raises: xfail() raised KeyError: 'n' (the check said pass"),
])
def test_supports_or_xfail_that_raise_are_error_records_naming_the_hook(capsys, tmp_path, backend, words):
    rc, info, recs, _ = _conform(capsys, tmp_path, backend)
    assert rc == 1 and len(recs) == 3 and info["backends"][backend]["available"] is True
    assert all(r["status"] == "error" and r["reason"].startswith(words) for r in recs), recs


def test_a_stack_that_cannot_run_is_unavailable_with_the_versions_found(capsys, tmp_path):
    import numpy

    rc, info, recs, _ = _conform(capsys, tmp_path, "toy-stack-broken")
    why = info["backends"]["toy-stack-broken"]["reason"]
    assert info["backends"]["toy-stack-broken"]["available"] is False
    assert why.startswith(f"a tiny call of its kernels fails here (numpy {numpy.__version__}")
    assert "run raised TypeError: only length-1 arrays can be converted" in why
    assert rc == runner.NOTHING_RAN and all(r["status"] == "skip" for r in recs)


def _failing_line():
    raise TypeError("only 0-dimensional arrays can be converted to Python scalars")


def test_a_wrapped_error_is_placed_at_the_line_that_failed_not_at_the_re_raise():
    """As the Triton interpreter's InterpreterError wraps a kernel's TypeError (``raise ... from``)."""
    try:
        try:
            _failing_line()
        except TypeError as exc:
            raise RuntimeError(repr(exc)) from exc
    except RuntimeError as wrapped:
        said = probe._hook_error("run", wrapped)
    first = _failing_line.__code__.co_firstlineno
    here = os.path.basename(__file__)
    assert said.startswith("run raised RuntimeError: TypeError('only 0-dimensional arrays")
    assert said.endswith(f" at {here}:{first + 1} (called from {here}:{first + 8})")


def test_the_probe_answers_in_a_worker_each_backend_alone():
    got = probe.probe_all([registry.get(n) for n in ("toy-avail-hangs", "toy-good", "toy-avail-aborts",
                                                       "toy-absent", "toy-avail-raises")])
    assert got["toy-good"] == (True, "always")
    assert got["toy-absent"] == (False, "needs hardware this machine lacks")
    assert [got[n][0] for n in ("toy-avail-hangs", "toy-avail-aborts", "toy-avail-raises")] == [False] * 3


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="workers side by side need two cores")
def test_a_hanging_probe_does_not_hold_back_another_environments_probes():
    import dataclasses

    other_env = dataclasses.replace(registry.get("toy-good"), env={"KERNEL_LAB_TOY_GROUP": "b"})
    ticks = []
    got = probe.probe_all([registry.get("toy-avail-hangs"), other_env], ticks.append)
    assert list(got) == ["toy-avail-hangs", "toy-good"] and got["toy-good"] == (True, "always")
    assert ticks == ["toy-good", "toy-avail-hangs"]   # answered while the other worker hung


def test_doctor_does_not_hang_on_a_hanging_probe(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNEL_LAB_FAMILY_MODULES": "tests.engine.toy_family",
           "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends"}
    done = subprocess.run([sys.executable, "-m", "kernel_lab", "doctor"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    lines = {ln.split()[1]: ln for ln in done.stdout.splitlines() if ln.startswith("  ") and len(ln.split()) > 2}
    assert lines["toy-avail-hangs"].split()[0] == "no" and "did not answer within 2 s" in lines["toy-avail-hangs"]
    assert lines["toy-avail-aborts"].split()[0] == "no" and lines["toy-good"].split()[0] == "yes"


@pytest.mark.parametrize("backend,status,words", [
    ("toy-supports-hangs", "error", "toy-supports-hangs: supports() did not answer within 2 s; killed"),
    ("toy-supports-segfaults", "crash", "toy-supports-segfaults: the process asking supports() died (signal SIGSEGV)"),
    ("toy-supports-exits", "crash", "toy-supports-exits: the process asking supports() died (exit status 3)"),
    ("toy-path-hangs", "error", "toy-path-hangs: path() did not answer within 2 s; killed"),
    ("toy-path-segfaults", "crash", "toy-path-segfaults: the process asking path() died (signal SIGSEGV)"),
])
def test_supports_or_path_that_hang_or_end_their_process_are_that_pairs_record(tmp_path, backend, status, words):
    # the run in its own process, as a user starts it: a hook run in the runner would hang or kill it
    start = time.monotonic()
    res = kl(*SMOKE, "--backend", backend, "--out", str(tmp_path))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    got = {r["params"]["n"]: r for r in records.read(tmp_path / "cells.jsonl")}
    assert {n: r["status"] for n, r in got.items()} == {8: "pass", 9: status, 10: "pass"}
    assert got[9]["reason"] == words and got[9]["path"].startswith("unknown: not asked (")
    info = json.loads((tmp_path / "run.json").read_text())
    assert "finished" in info and "stopped" not in info and not (tmp_path / run_folder.LOCK_NAME).exists()
    assert time.monotonic() - start < 60


def test_a_hanging_supports_does_not_hang_a_cost_shard(tmp_path):
    res = kl(*SMOKE, "--backend", "toy-supports-hangs,toy-good", "--shard", "1/2", "--shard-by", "cost",
             "--out", str(tmp_path), "--timeout", "20")
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr
    assert records.read(tmp_path / "cells.jsonl")
