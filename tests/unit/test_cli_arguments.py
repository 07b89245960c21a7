"""`study`, `flydsl build` and `plan-blocks` check their arguments before any work: one line naming
the argument (and the limit), exit 2, no traceback, nothing written."""
import json

import pytest

from conformance import studies
from kernel_lab import cli


def _one_line(capsys, argv, word):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, out, err)
    assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_study_runs(monkeypatch):
    """Any study that starts its work fails the test: the checks must come first."""
    for mod in studies.studies().values():
        monkeypatch.setattr(mod, "run", lambda args, name=mod.NAME: pytest.fail(f"{name} ran"))


GDN_DRIFT = [
    (["--heads", "2"], "--heads"), (["--heads", "2,3"], "--heads"), (["--heads", "0,4"], "--heads"),
    (["--heads", "a,b"], "--heads"), (["--heads", "2,100000"], "--heads"),
    (["--tokens", "0"], "--tokens"), (["--tokens", "100"], "--tokens"), (["--tokens", str(1 << 40)], "--tokens"),
    (["--dim", "0"], "--dim"), (["--dim", "100000"], "--dim"),
    (["--round-trip-tokens", "0"], "--round-trip-tokens"),
    (["--round-trip-tokens", "131072", "--tokens", "1024"], "--round-trip-tokens"),
    (["--round-trips", "1,x"], "--round-trips"), (["--round-trips", "-1"], "--round-trips"),
    (["--round-trips", "9000"], "--round-trips"),
    (["--v-scale", "nan"], "--v-scale"), (["--v-scale", "-1"], "--v-scale"), (["--v-scale", "1e300"], "--v-scale"),
]
TQ_DISTORTION = [(["--dim", "0"], "--dim"), (["--dim", "100"], "--dim"), (["--dim", "48", "--rotation", "hadamard"], "--dim"),
                 (["--vectors", "0"], "--vectors"), (["--vectors", str(10 ** 9)], "--vectors")]


@pytest.mark.parametrize("args,word", GDN_DRIFT)
def test_gdn_drift_arguments(capsys, tmp_path, no_study_runs, args, word):
    _one_line(capsys, ["study", "gdn-drift", *args, "--out", tmp_path / "s.json"], word)
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("args,word", TQ_DISTORTION)
def test_tq_distortion_arguments(capsys, tmp_path, no_study_runs, args, word):
    _one_line(capsys, ["study", "tq-distortion", *args, "--out", tmp_path / "s.json"], word)


def test_other_studies_name_their_arguments(capsys, tmp_path, no_study_runs):
    _one_line(capsys, ["study", "tq-store-flips", "--backend", "nope", "--out", tmp_path / "s.json"], "nope")
    _one_line(capsys, ["study", "tq-store-flips", "--backend", "numpy-ref", "--tier", "huge",
                       "--out", tmp_path / "s.json"], "--tier")
    _one_line(capsys, ["study", "fla-chunk-rounding", "--record", tmp_path / "absent.jsonl"], "--record")
    (tmp_path / "bad.jsonl").write_text('{"id": 3, "backend": "fla", "status": "pass"}\n')
    _one_line(capsys, ["study", "fla-chunk-rounding", "--record", tmp_path / "bad.jsonl"], "bad.jsonl:1")


@pytest.mark.parametrize("out", ["", "folder", "below-a-file"])
def test_a_study_out_that_cannot_be_a_file_is_refused_first(capsys, tmp_path, no_study_runs, out):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    target = {"": "", "folder": tmp_path / "folder", "below-a-file": tmp_path / "file" / "s.json"}[out]
    _one_line(capsys, ["study", "tq-distortion", "--out", target], "--out")


@pytest.mark.parametrize("args,word", [
    (["--arch", "gfx942"], "--arch 'gfx942'"), (["--arch", "sm_90"], "--arch"),
    (["--out", ""], "--out"), (["--out", "FILE"], "--out"),
])
def test_flydsl_build_arguments(capsys, tmp_path, args, word):
    (tmp_path / "f").write_text("")
    argv = ["flydsl", "build", "--arch", "gfx950", "--out", tmp_path / "isa"]
    for flag, value in zip(args[::2], args[1::2]):
        argv[argv.index(flag) + 1] = tmp_path / "f" if value == "FILE" else value
    _one_line(capsys, argv, word)
    assert not (tmp_path / "isa").exists()


def _config(tmp_path, **change):
    config = json.loads((cli.Path(__file__).parents[2] / "planner" / "configs" / "qwen3-next-80b-a3b.json").read_text())
    fields = config.get("text_config", config)
    fields.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("change,word", [
    ({"head_dim": 100_000}, "'head_dim'=100000: expected at most 1024"),
    ({"linear_key_head_dim": 5000}, "'linear_key_head_dim'=5000: expected at most 1024"),
    ({"linear_conv_kernel_dim": 4096}, "'linear_conv_kernel_dim'=4096: expected at most 64"),
    ({"layer_types": [["full_attention"]]}, "'layer_types': entry 0 is ['full_attention'], not a layer kind"),
    ({"layer_types": [{"kind": 1}, "x"]}, "'layer_types': entry 0"),
    ({"layer_types": "full_attention"}, "expected a non-empty list of layer kinds"),
])
def test_plan_blocks_refuses_sizes_no_model_has_and_malformed_layer_types(capsys, tmp_path, change, word):
    _one_line(capsys, ["plan-blocks", "--config", _config(tmp_path, **change)], word)


def test_plan_blocks_limits_speculative_tokens_and_names_a_config_that_is_not_utf8(capsys, tmp_path):
    _one_line(capsys, ["plan-blocks", "--model", "qwen3-next-80b-a3b", "--spec-tokens", "100000"],
              "spec_tokens=100000: expected an integer in [0, 256]")
    bad = tmp_path / "latin1.json"
    bad.write_bytes('{"model_type": "caf\xe9"}'.encode("latin-1"))
    _one_line(capsys, ["plan-blocks", "--config", bad], f"config {bad} is not UTF-8 text (byte 19)")
    assert cli.main(["plan-blocks", "--model", "qwen3-next-80b-a3b", "--spec-tokens", "2"]) == 0
