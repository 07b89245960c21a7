"""Block arithmetic (planner.block_size): KV bytes per token, the state page, the unified block size.

Expected numbers are computed by hand from the shapes (module docstring of planner.block_size), and
two are published: vLLM PR #52191 measured 1152-token (float32 state) and 640-token (bfloat16 state)
blocks for Qwen3.6-35B-A3B on an AMX CPU with KV auto; Qwen3.6-35B-A3B has the text shape of our
qwen3.5-35b-a3b config.
"""
import itertools

import pytest

from planner import model_configs
from planner.block_size import (BLOCK_ALIGNMENT, kv_bytes_per_token, plan_blocks, state_page,
                                unified_block_size)
from planner.state_dtype_policy import PLATFORMS, REQUESTS


def model(name):
    return model_configs.parse_config(model_configs.shipped_config(name))


def test_alignments_are_the_engine_defaults():
    assert BLOCK_ALIGNMENT == {"cpu": 128, "gpu": 16}


@pytest.mark.parametrize("tp, kv, expected", [
    (1, "auto", 2 * 2 * 256 * 2), (1, "fp8", 2 * 2 * 256 * 1),
    (2, "auto", 2 * 1 * 256 * 2),
    (4, "auto", 2 * 1 * 256 * 2),   # 2 KV heads over 4 ranks: replicated, one head per rank
])
def test_kv_bytes_per_token_qwen3_next(tp, kv, expected):
    assert kv_bytes_per_token(model("qwen3-next-80b-a3b"), tp, kv) == expected


def test_gdn_state_page_qwen3_next():
    page = state_page(model("qwen3-next-80b-a3b"), 1, "float32", "bfloat16")
    assert page.ssm_shape == (32, 128, 128) and page.conv_shape == (2 * 16 * 128 + 32 * 128, 3)
    assert (page.ssm_bytes, page.conv_bytes) == (2_097_152, 49_152)
    half = state_page(model("qwen3-next-80b-a3b"), 1, "bfloat16", "bfloat16")
    assert (half.ssm_bytes, half.conv_bytes) == (1_048_576, 49_152)
    sharded = state_page(model("qwen3-next-80b-a3b"), 4, "float32", "bfloat16", spec_tokens=2)
    assert sharded.ssm_shape == (8, 128, 128) and sharded.conv_shape == (2048, 5)


def test_mamba2_state_page_nemotron():
    page = state_page(model("nemotron-nano-9b-v2"), 1, "float32", "bfloat16")
    # conv channels = heads*head_dim + 2*groups*d_state = 10240 + 2048
    assert page.ssm_shape == (128, 80, 128) and page.conv_shape == (12288, 3)
    assert page.total_bytes == 128 * 80 * 128 * 4 + 12288 * 3 * 2
    assert state_page(model("nemotron-nano-9b-v2"), 8, "float32", "bfloat16").conv_shape == (1536, 3)


def test_unified_block_size_is_the_smallest_aligned_fit():
    assert unified_block_size(128 * 2048 * 5, 2048, 128) == 640       # exact fit: no extra block
    assert unified_block_size(128 * 2048 * 5 + 1, 2048, 128) == 768   # one byte more: next multiple
    assert unified_block_size(1, 2048, 16) == 16


@pytest.mark.parametrize("state, kv, expected", [
    ("auto", "auto", 1152), ("bfloat16", "auto", 640),    # published in vLLM PR #52191
    ("auto", "fp8", 2176), ("bfloat16", "fp8", 1152),     # derived: 2096 and 1072 tokens, rounded up
])
def test_qwen35_35b_on_amx_cpu_reproduces_pr_52191(state, kv, expected):
    plan = plan_blocks(model_configs.shipped_config("qwen3.5-35b-a3b"), state, "cpu-avx512bf16",
                       kv, tp=1)
    assert plan.block_size == expected


def test_gpu_alignment_16():
    cfg = model_configs.shipped_config("qwen3.5-35b-a3b")
    # 2_146_304 B state page / 2048 B per token = 1048 tokens -> 1056 on a 16 grain
    assert plan_blocks(cfg, "auto", "gpu", "auto", tp=1).block_size == 1056
    # Qwen3.5-27B, fp8 KV, 3 speculative tokens: conv (10240, 6) bf16 + ssm (48,128,128) fp32
    # = 3_268_608 B over 2 * 4 * 256 * 1 B per token = 1596 tokens -> 1600
    plan = plan_blocks(model_configs.shipped_config("qwen3.5-27b"), "auto", "gpu", "fp8", tp=1,
                       spec_tokens=3)
    assert (plan.state.total_bytes, plan.block_size) == (3_268_608, 1600)


def test_bfloat16_state_about_halves_the_block_and_the_state_memory():
    cfg = model_configs.shipped_config("qwen3-next-80b-a3b")
    wide = plan_blocks(cfg, "auto", "cpu-avx512bf16", "auto", tp=1)
    half = plan_blocks(cfg, "bfloat16", "cpu-avx512bf16", "auto", tp=1)
    assert (wide.block_size, half.block_size) == (1152, 640)
    assert wide.state_bytes_per_sequence == 36 * 2_146_304
    assert half.state_bytes_per_sequence == 36 * 1_097_728
    assert half.padded_state_bytes_per_sequence == 36 * 640 * 2048


def test_mamba_only_model_gets_no_smaller_block_from_a_bf16_request():
    cfg = model_configs.shipped_config("nemotron-nano-9b-v2")
    plans = [plan_blocks(cfg, s, "cpu-avx512bf16", "auto", tp=1) for s in ("auto", "bfloat16")]
    assert [p.block_size for p in plans] == [1408, 1408]    # 5_316_608 B / 4096 B = 1298 -> 1408


CASES = list(itertools.product(model_configs.model_names(), REQUESTS, PLATFORMS, ("auto", "fp8"),
                               (1, 2, 4)))


@pytest.mark.parametrize("name, state, platform, kv, tp", CASES)
def test_attention_page_holds_the_state_page_and_one_block_less_does_not(name, state, platform,
                                                                           kv, tp):
    plan = plan_blocks(model_configs.shipped_config(name), state, platform, kv, tp)
    assert plan.block_size % plan.alignment == 0
    assert plan.attention_page_bytes >= plan.state.total_bytes
    assert (plan.block_size - plan.alignment) * plan.kv_bytes_per_token < plan.state.total_bytes
    assert plan.state_padding_bytes == plan.attention_page_bytes - plan.state.total_bytes >= 0


@pytest.mark.parametrize("call, match", [
    (lambda: kv_bytes_per_token(model("qwen3-next-80b-a3b"), 1, "fp4"), "kv dtype='fp4'"),
    (lambda: kv_bytes_per_token(model("qwen3-next-80b-a3b"), 3, "auto"), "tp=3 is not a multiple"),
    (lambda: kv_bytes_per_token(model("nemotron-nano-9b-v2"), 12, "auto"), "tp=12 is not a multiple"),
    (lambda: state_page(model("qwen3-next-80b-a3b"), 1, "fp8", "bfloat16"), "state dtype='fp8'"),
    (lambda: state_page(model("qwen3-next-80b-a3b"), 1, "float32", "bfloat16", -1), "spec_tokens"),
    (lambda: unified_block_size(0, 2048, 128), "state_page_bytes=0"),
    (lambda: unified_block_size(10, 2048, 0), "alignment=0"),
    (lambda: plan_blocks(model_configs.shipped_config("qwen3.5-27b"), "bfloat16", "gpu", "auto",
                         tp=3), "not divisible by tp=3"),
])
def test_bad_arguments_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
