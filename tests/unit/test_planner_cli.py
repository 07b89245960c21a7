"""`plan-blocks` command (planner.cli): the printed decision and block size; bad input exits 2."""
import json

import pytest

from kernel_lab import cli as kernel_lab_cli
from planner import cli, model_configs


def run(capsys, *argv):
    status = cli.main(["plan-blocks", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_prints_decision_reason_and_block_size(capsys):
    status, out, err = run(capsys, "--model", "qwen3-next-80b-a3b", "--device", "cpu",
                           "--state-dtype", "bfloat16", "--kv-dtype", "auto", "--tp", "1")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert "state dtype: bfloat16 (kept); conv state dtype: bfloat16" in lines
    assert any(line.startswith("reason: bfloat16 kept") for line in lines)
    assert ("state memory per sequence: 37.69 MiB, 45.00 MiB in padded pages "
            "(36 linear_attention layers, per rank)") in lines
    assert lines[-1] == "block_size: 640"


@pytest.mark.parametrize("argv, block, state", [
    (["--model", "qwen3-next-80b-a3b"], 1152, "float32 (reset to float32)"),
    (["--model", "qwen3-next-80b-a3b", "--kv-dtype", "fp8"], 2176, "float32 (reset to float32)"),
    (["--model", "qwen3-next-80b-a3b", "--state-dtype", "bfloat16", "--kv-dtype", "fp8"], 1152,
     "bfloat16 (kept)"),
    (["--model", "qwen3-next-80b-a3b", "--device", "gpu"], 544, "bfloat16 (kept)"),
    (["--model", "nemotron-nano-9b-v2", "--state-dtype", "bfloat16"], 1408,
     "float32 (reset to float32)"),
    (["--model", "nemotron-nano-9b-v2", "--state-dtype", "bfloat16", "--no-avx512-bf16"], 768,
     "bfloat16 (kept)"),
])
def test_block_size_line(capsys, argv, block, state):
    status, out, _ = run(capsys, *argv)
    assert status == 0
    assert f"state dtype: {state}" in out
    assert out.splitlines()[-1] == f"block_size: {block}"


def test_config_path_gives_the_same_plan_as_the_shipped_name(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model_configs.shipped_config("qwen3.5-27b")))
    _, by_path, _ = run(capsys, "--config", str(path), "--state-dtype", "float16", "--tp", "2")
    _, by_name, _ = run(capsys, "--model", "qwen3.5-27b", "--state-dtype", "float16", "--tp", "2")
    assert by_path.splitlines()[1:] == by_name.splitlines()[1:]


def _one_error_line(status, out, err, match):
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and match in err


@pytest.mark.parametrize("content, match", [
    (None, "cannot read config"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"model_type": "qwen3_next"}), "missing field 'layer_types'"),
])
def test_bad_config_file_is_one_line_and_status_2(capsys, tmp_path, content, match):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    _one_error_line(*run(capsys, "--config", str(path)), match)


@pytest.mark.parametrize("argv, match", [
    (["--model", "qwen3.5-27b", "--tp", "3"], "not divisible by tp=3"),
    (["--model", "qwen3.5-27b", "--tp", "0"], "tp=0"),
    (["--model", "qwen3.5-27b", "--spec-tokens", "-1"], "spec_tokens=-1"),
    (["--model", "qwen3.5-27b", "--device", "gpu", "--no-avx512-bf16"], "needs --device cpu"),
])
def test_bad_arguments_are_one_line_and_status_2(capsys, argv, match):
    _one_error_line(*run(capsys, *argv), match)


@pytest.mark.parametrize("argv", [["--model", "qwen9"], ["--model", "qwen3.5-27b", "--kv-dtype", "fp4"],
                                  ["--model", "qwen3.5-27b", "--state-dtype", "bf16"], []])
def test_unknown_choices_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan-blocks", *argv])
    assert exc.value.code == 2


def test_registered_in_kernel_lab(capsys):
    status = kernel_lab_cli.main(["plan-blocks", "--model", "qwen3.5-35b-a3b", "--state-dtype",
                              "bfloat16"])
    assert status == 0
    assert capsys.readouterr().out.splitlines()[-1] == "block_size: 640"
