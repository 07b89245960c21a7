"""Arguments at the CLI's limits are one line, and names are checked before torch is imported:
timeouts, shard counts, plugin modules, control characters, an empty RUN_DIR, head dims."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_in_process import main, one_error_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,expected", [
    (["--timeout", "inf"], "--timeout inf: expected a number of seconds above 0 and at most 604800"),
    (["--timeout", "3e6"], "--timeout 3000000.0: expected"),
    (["--timeout", "nan"], "--timeout nan: expected"),
    (["--shard", "1/100000000", "--shard-by", "cost"], "expected K/N with 1 <= K <= N <= 100,000"),
    (["--shard", "1/100000000000000000000", "--shard-by", "cost"], "expected K/N with 1 <= K <= N <= 100,000"),
    (["--backend", "numpy-reff"], "unknown backend 'numpy-reff'; did you mean numpy-ref?"),
    (["--family", "gnd"], "unknown family 'gnd'; did you mean gdn?"),
    (["--tier", "cii"], "unknown tier 'cii'; did you mean ci?"),
    (["--backend", "numpy\x1b[2Jref"], "unknown backend 'numpy\\x1b[2Jref'"),
])
def test_conform_refuses_in_one_line(tmp_path, capsys, args, expected):
    rc, _, err = main(capsys, "conform", *args, "--out", tmp_path / "o")
    assert rc == 2 and expected in one_error_line(err) and not (tmp_path / "o").exists()


def test_an_unknown_backend_is_refused_within_seconds_without_importing_torch(tmp_path):
    code = ("import sys; from kernel_lab import cli; rc = cli.main(['conform', '--backend', 'numpy-reff', '--out', "
            f"{str(tmp_path / 'o')!r}]); print('torch' in sys.modules); sys.exit(rc)")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stdout.strip() == "False", done.stdout + done.stderr
    assert "did you mean numpy-ref?" in one_error_line(done.stderr)
    assert time.monotonic() - start < 10   # about a second on a quiet machine


def test_a_plugin_module_that_does_not_import_is_one_line(tmp_path, capsys, monkeypatch):
    from conformance import registry

    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "my_pkg.nope")
    monkeypatch.setattr(registry, "_LOADED", False)
    rc, _, err = main(capsys, "conform", "--family", "gdn", "--out", tmp_path / "o")
    assert rc == 2 and "KERNEL_LAB_BACKEND_MODULES: cannot import my_pkg.nope" in one_error_line(err)


def test_report_refuses_an_empty_run_folder_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = main(capsys, "report", "")
    assert rc == 2 and "RUN_DIR: empty" in one_error_line(err) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("head_dim", [1, 3, 7])
def test_plan_blocks_refuses_head_dims_that_are_not_whole_vectors(tmp_path, capsys, head_dim):
    config = json.loads((ROOT / "planner" / "configs" / "qwen3-next-80b-a3b.json").read_text())
    config["head_dim"] = head_dim
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc, _, err = main(capsys, "plan-blocks", "--config", path)
    assert rc == 2 and f"'head_dim'={head_dim}: expected a multiple of 8" in err


def test_a_one_cell_repro_prints_why_it_failed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_FAMILY_MODULES", "tests.engine.toy_family")
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.engine.toy_backends")
    import tests.engine.toy_backends  # noqa: F401

    rc, out, _ = main(capsys, "conform", "--family", "toy", "--tier", "smoke", "--backend", "toy-wrong",
                      "--filter", "^toy/scale/n=8/", "--out", tmp_path / "o")
    (verdict,) = [line for line in out.splitlines() if line.startswith("fail: ")]
    assert rc == 1 and "margin" in verdict and "by elementwise" in verdict and "tolerance" in verdict
    assert "repro: kernel-lab conform --tier smoke --filter" in verdict


def test_a_captured_inputs_path_is_kept_absolute_so_the_repro_runs_from_anywhere(tmp_path, capsys, monkeypatch):
    from conformance.inputs import capture
    from tests.unit.test_captured_inputs import tq_arrays

    capture.save(tmp_path / "decode.npz", tq_arrays())
    monkeypatch.chdir(tmp_path)
    rc, _, _ = main(capsys, "conform", "--inputs", "decode.npz", "--family", "turboquant", "--op", "decode",
                    "--backend", "numpy-ref", "--out", tmp_path / "run")
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rc == 0 and info["selection"]["inputs_file"] == str(tmp_path / "decode.npz")


def test_doctor_shows_its_progress_while_it_probes(capsys, monkeypatch):
    from conformance import registry
    from conformance.run import probe

    monkeypatch.setattr(probe, "probe_all", lambda backends, tick: [tick(b.name) for b in backends] and
                        {b.name: (False, "not probed in this test") for b in backends})
    rc, out, err = main(capsys, "doctor")
    assert rc == 0 and f"probed {len(registry.backends())}/{len(registry.backends())} backends" in err
    assert "not probed in this test" in out
