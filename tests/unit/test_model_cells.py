"""Model-shaped cells: the heads and head sizes come from the model's config."""
import json

import pytest

from conformance.inputs import model_cells
from kernel_lab.cli import main
from planner.model_configs import CONFIG_DIR


def test_qwen3_next_shapes():
    cells = model_cells.for_model("qwen3-next-80b-a3b")
    gdn = [c for c in cells if c.family == "gdn" and c.op != "gating"]
    tq = [c for c in cells if c.family == "turboquant"]
    assert gdn and all((c["H"], c["HV"], c["K"]) == (16, 32, 128) for c in gdn)
    assert {c.op for c in gdn} == {"recurrent", "chunked", "decode", "spec_decode"}
    assert tq and all((c["Hk"], c["D"]) == (2, 256) for c in tq)
    assert all(c["G"] == 8 for c in tq if c.op != "store")
    assert {(c["preset"], c["layout"]) for c in tq} == {(p, lay) for p in (
        "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "turboquant_k8v4") for lay in ("aos", "soa")}


def test_cells_take_the_config_dtype_as_their_activation_dtype(tmp_path):
    config = json.loads((CONFIG_DIR / "qwen3-next-80b-a3b.json").read_text())
    assert {c["act"] for c in model_cells.for_model("qwen3-next-80b-a3b")} == {"bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "torch_dtype": "float16"}))
    assert {c["act"] for c in model_cells.for_model(path=str(path))} == {"float16"}
    assert model_cells.activation_of({"text_config": {"dtype": "float32"}}) == "float32"
    assert model_cells.activation_of({"torch_dtype": "float8_e4m3fn"}) == "bfloat16"


def test_a_model_without_gdn_layers_adds_only_attention_cells():
    cells = model_cells.for_model("nemotron-nano-9b-v2")
    assert cells and {c.family for c in cells} == {"turboquant"}
    assert all(c["D"] == 128 and c["Hk"] == 8 for c in cells)


def test_extend_filters_and_does_not_duplicate():
    base = model_cells.for_model("qwen3-next-80b-a3b")[:3]
    out = model_cells.extend(base, "qwen3-next-80b-a3b", None, family="gdn", op="decode")
    assert out[:3] == base and {c.op for c in out[3:]} == {"decode"}
    assert len(out) == len(set(out))


def test_bad_config_is_a_clear_error(tmp_path):
    path = tmp_path / "config.json"
    config = json.loads((CONFIG_DIR / "qwen3-next-80b-a3b.json").read_text())
    config["num_attention_heads"] = 3
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_attention_heads=3"):
        model_cells.for_model(path=str(path))
    with pytest.raises(ValueError, match="one of model"):
        model_cells.for_model()


def test_cli_unknown_model_exits_2(capsys, tmp_path):
    assert main(["conform", "--model", "no-such-model", "--out", str(tmp_path / "run")]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
