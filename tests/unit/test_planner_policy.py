"""State-dtype policy (planner.state_dtype_policy): which state dtype is kept, which falls back, why."""
import copy

import pytest

from planner import model_configs
from planner.state_dtype_policy import CONTRACTS, decide_state_dtype, declared_state_dtypes

GDN_MODELS = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "qwen3.5-27b")
MAMBA_MODEL = "nemotron-nano-9b-v2"


def cfg(name):
    return model_configs.shipped_config(name)


@pytest.mark.parametrize("name", GDN_MODELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gdn_model_keeps_low_precision_request_on_avx512_bf16_cpu(name, dtype):
    d = decide_state_dtype(cfg(name), dtype, "cpu-avx512bf16", tp=1)
    assert (d.state_dtype, d.reset) == (dtype, False)
    assert d.conv_dtype == "bfloat16"
    assert "kept" in d.reason


@pytest.mark.parametrize("name", GDN_MODELS + (MAMBA_MODEL,))
def test_auto_falls_back_to_float32_on_avx512_bf16_cpu(name):
    d = decide_state_dtype(cfg(name), "auto", "cpu-avx512bf16", tp=1)
    assert (d.state_dtype, d.reset) == ("float32", True)
    assert "only an explicit bfloat16 or float16 request" in d.reason


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mamba_only_model_falls_back_to_float32(dtype):
    d = decide_state_dtype(cfg(MAMBA_MODEL), dtype, "cpu-avx512bf16", tp=1)
    assert (d.state_dtype, d.reset) == ("float32", True)
    assert "no linear_attention layer" in d.reason and "nemotron_h" in d.reason


def _ignores_request(model, requested):
    """Old vLLM GDN contract: (model dtype, model dtype), whatever was requested."""
    return model.model_dtype, model.model_dtype


def _swapped_pair(model, requested):
    """A contract that returns the pair in (ssm, conv) order instead of (conv, ssm)."""
    conv, ssm = declared_state_dtypes(model, requested)
    return ssm, conv


@pytest.mark.parametrize("contract, dtype", [(_ignores_request, "float16"),
                                             (_swapped_pair, "float16")])
def test_contract_mismatch_falls_back_to_float32(contract, dtype):
    contracts = {**CONTRACTS, "qwen3_next": contract}
    d = decide_state_dtype(cfg("qwen3-next-80b-a3b"), dtype, "cpu-avx512bf16", tp=1,
                           contracts=contracts)
    assert (d.state_dtype, d.reset) == ("float32", True)
    assert "contract mismatch" in d.reason


def test_same_broken_contract_still_keeps_a_request_it_happens_to_match():
    # the policy compares the declared ssm dtype with the request; nothing else
    contracts = {**CONTRACTS, "qwen3_next": _ignores_request}
    d = decide_state_dtype(cfg("qwen3-next-80b-a3b"), "bfloat16", "cpu-avx512bf16", tp=1,
                           contracts=contracts)
    assert (d.state_dtype, d.reset) == ("bfloat16", False)


def test_unknown_model_type_does_not_claim_low_precision():
    config = copy.deepcopy(cfg("qwen3-next-80b-a3b"))
    config["model_type"] = "some_future_gdn_model"
    d = decide_state_dtype(config, "bfloat16", "cpu-avx512bf16", tp=1)
    assert (d.state_dtype, d.reset) == ("float32", True)
    assert "no state-dtype contract" in d.reason


def test_unknown_model_type_off_the_avx512_cpu_is_a_clear_error():
    config = copy.deepcopy(cfg("qwen3-next-80b-a3b"))
    config["model_type"] = "some_future_gdn_model"
    with pytest.raises(ValueError, match="no state-dtype contract for model_type"):
        decide_state_dtype(config, "auto", "gpu", tp=1)


def test_float32_request_is_not_a_reset():
    d = decide_state_dtype(cfg("qwen3.5-35b-a3b"), "float32", "cpu-avx512bf16", tp=1)
    assert (d.state_dtype, d.reset) == ("float32", False)


@pytest.mark.parametrize("name, expected", [("qwen3-next-80b-a3b", "bfloat16"),
                                            ("qwen3.5-35b-a3b", "float32"),
                                            (MAMBA_MODEL, "float32")])
def test_gpu_resolves_auto_through_the_contract(name, expected):
    # Qwen3-Next declares nothing (model dtype); Qwen3.5 configs declare mamba_ssm_dtype float32;
    # NemotronH's auto without a declared dtype is float32.
    d = decide_state_dtype(cfg(name), "auto", "gpu", tp=1)
    assert (d.state_dtype, d.reset) == (expected, False)


@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_platforms_without_the_reset_keep_any_explicit_request(platform):
    d = decide_state_dtype(cfg(MAMBA_MODEL), "float16", platform, tp=1)
    assert (d.state_dtype, d.reset) == ("float16", False)


def test_config_without_layer_types_derives_them_like_transformers():
    # A real Qwen3-Next config.json carries full_attention_interval, not layer_types.
    config = copy.deepcopy(cfg("qwen3-next-80b-a3b"))
    del config["layer_types"]
    model = model_configs.parse_config(config)
    assert model.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert (model.num_recurrent_layers, model.num_attention_layers) == (36, 12)
    assert decide_state_dtype(config, "bfloat16", "cpu-avx512bf16", 1).state_dtype == "bfloat16"


def test_nemotron_pattern_gives_27_mamba_and_4_attention_layers():
    model = model_configs.parse_config(cfg(MAMBA_MODEL))
    assert (model.num_recurrent_layers, model.num_attention_layers) == (27, 4)


@pytest.mark.parametrize("fields", [("linear_num_value_heads",), ("num_key_value_heads",),
                                    ("head_dim",), ("layer_types", "full_attention_interval"),
                                    ("torch_dtype",)])
def test_missing_field_is_a_clear_error(fields):
    config = copy.deepcopy(cfg("qwen3.5-27b"))
    for field in fields:
        del config["text_config"][field]
    field = fields[0]
    with pytest.raises(ValueError, match=field):
        decide_state_dtype(config, "bfloat16", "cpu-avx512bf16", tp=1)


def test_missing_model_type_is_a_clear_error():
    config = copy.deepcopy(cfg("qwen3-next-80b-a3b"))
    del config["model_type"]
    with pytest.raises(ValueError, match="model_type"):
        decide_state_dtype(config, "auto", "gpu", tp=1)


@pytest.mark.parametrize("name, tp, match", [
    ("qwen3.5-27b", 32, "linear_num_key_heads=16 is not divisible by tp=32"),
    ("qwen3.5-27b", 5, "not divisible by tp=5"),
    (MAMBA_MODEL, 3, "mamba_num_heads=128 is not divisible by tp=3"),
])
def test_heads_not_divisible_by_tp_is_a_clear_error(name, tp, match):
    with pytest.raises(ValueError, match=match):
        decide_state_dtype(cfg(name), "bfloat16", "cpu-avx512bf16", tp=tp)


@pytest.mark.parametrize("tp", [0, -2, 1.5, True])
def test_bad_tp_is_a_clear_error(tp):
    with pytest.raises(ValueError, match="tp="):
        decide_state_dtype(cfg("qwen3-next-80b-a3b"), "auto", "gpu", tp=tp)


@pytest.mark.parametrize("kwargs, match", [
    ({"requested": "fp8"}, "requested state dtype='fp8'"),
    ({"requested": "bf16"}, "requested state dtype='bf16'"),
    ({"platform": "tpu"}, "platform='tpu'"),
])
def test_unknown_dtype_or_platform_is_a_clear_error(kwargs, match):
    args = {"requested": "bfloat16", "platform": "cpu-avx512bf16", **kwargs}
    with pytest.raises(ValueError, match=match):
        decide_state_dtype(cfg("qwen3-next-80b-a3b"), args["requested"], args["platform"], tp=1)


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.update(torch_dtype="int8"), "torch_dtype"),
    (lambda c: c.update(mamba_ssm_dtype="fp4"), "declares state dtype 'fp4'"),
    (lambda c: c.update(head_dim=0), "'head_dim'=0"),
    (lambda c: c.update(layer_types=["full_attention"] * 47 + ["sliding"]), "unknown kinds"),
    (lambda c: c.update(layer_types=["linear_attention"] * 48), "no full_attention layer"),
    (lambda c: c.update(layer_types=["full_attention"] * 48), "no linear_attention or mamba"),
    (lambda c: c.update(num_hidden_layers=40), "48 layer kinds but num_hidden_layers=40"),
])
def test_bad_config_values_are_clear_errors(mutate, match):
    config = copy.deepcopy(cfg("qwen3-next-80b-a3b"))
    mutate(config)
    with pytest.raises(ValueError, match=match):
        model_configs.parse_config(config)


def test_non_dict_config_is_a_type_error():
    with pytest.raises(TypeError, match="config"):
        model_configs.parse_config(["not", "a", "dict"])
