"""Unified block size for hybrid prefix caching: the attention page must hold one state page.

A hybrid model (attention layers plus GDN/Mamba layers) uses one block size for both caches. Per
layer, an attention block of ``B`` tokens takes ``B * kv_bytes_per_token`` bytes; a recurrent layer
keeps one state page per block (the ssm state plus the conv state of one sequence). The block size
is the smallest multiple of the platform's alignment ``A`` whose attention page holds the state page:

    B = A * ceil(state_page_bytes / (A * kv_bytes_per_token))

(vLLM ``Platform._align_hybrid_block_size`` in ``vllm/platforms/interface.py``, the branch used by
``mamba_cache_mode="align"``, which prefix caching selects for Qwen3-Next / Qwen3.5; the state page
is then padded up to the attention page.) Integer bytes throughout, no rounding anywhere but the
ceiling above.

Byte counts, per layer, per tensor-parallel rank:

- attention: ``2 (K and V) * kv_heads_per_rank * head_dim * sizeof(kv dtype)``; KV ``auto`` is the
  model dtype, ``fp8`` one byte.
- GDN state (vLLM ``gated_delta_net_state_shape``): ssm ``[HV/tp, V, K]`` in the state dtype, conv
  ``[(2*H*K + HV*V)/tp, conv_kernel - 1 + spec_tokens]`` in the conv dtype (the model dtype).
- Mamba2 state (vLLM ``mamba2_state_shape``): ssm ``[heads/tp, head_dim, d_state]``, conv
  ``[heads*head_dim/tp + 2*groups_per_rank*d_state, conv_kernel - 1 + spec_tokens]``.

Alignment ``A`` = max(smallest kernel block size of the attention backend, the platform's block
size), as ``_align_hybrid_block_size`` computes it:

- CPU: 128. ``CpuPlatform.check_and_update_config`` (vllm/platforms/cpu.py) sets ``block_size = 128``
  when the user gives none (and warns unless it is a multiple of 32); the CPU_ATTN backend declares
  kernel block sizes ``MultipleOf(16)``; max(16, 128) = 128. Cross-check: PR #52191 reports, for
  Qwen3.6-35B-A3B on AMX with KV auto, effective blocks of 1152 tokens (float32 state) and 640
  (bfloat16 state); this module reproduces both (tests/unit/test_planner_block_size.py).
- GPU: 16, the default block size and the ``MultipleOf(16)`` kernel block of the FlashAttention /
  FlashInfer backends. Cross-check (third-party reports on upstream vLLM, not vLLM's own docs): a
  1056-token block for Qwen3.6-35B-A3B on CUDA, and a 3,268,608 B page with a 1600-token block for
  Qwen3.5-27B with fp8 KV and 3 speculative tokens; both are reproduced in the tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.model_configs import MAX_SPEC_TOKENS, GdnDims, ModelConfig, check_tp, parse_config
from planner.state_dtype_policy import PLATFORMS, StateDtypeDecision, decide_state_dtype

BLOCK_ALIGNMENT = {"cpu": 128, "gpu": 16}
ALIGNMENT_SOURCE = {
    "cpu": "vLLM CpuPlatform default block_size 128 (CPU_ATTN kernel blocks are multiples of 16)",
    "gpu": "vLLM default block_size 16 (FlashAttention/FlashInfer kernel blocks multiples of 16)",
}
KV_DTYPES = ("auto", "fp8")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def device_of(platform: str) -> str:
    """``cpu-avx512bf16`` and ``cpu`` are the CPU; ``gpu`` the GPU."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: expected one of {', '.join(PLATFORMS)}")
    return "gpu" if platform == "gpu" else "cpu"


def kv_bytes_per_token(model: ModelConfig, tp: int, kv_dtype: str) -> int:
    """Attention KV bytes of one token in one layer on one rank (K and V)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv dtype={kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
    element = DTYPE_BYTES[model.model_dtype if kv_dtype == "auto" else kv_dtype]
    return 2 * model.kv_heads_per_rank(tp) * model.head_dim * element


@dataclass(frozen=True)
class StatePage:
    """One recurrent layer's state for one sequence on one rank: shapes and bytes."""

    ssm_shape: tuple[int, ...]
    conv_shape: tuple[int, ...]
    ssm_bytes: int
    conv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.ssm_bytes + self.conv_bytes


def state_page(model: ModelConfig, tp: int, state_dtype: str, conv_dtype: str,
               spec_tokens: int = 0) -> StatePage:
    """The state page of one recurrent layer (see the module docstring for the shapes)."""
    model.check_recurrent_tp(tp)
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or not 0 <= spec_tokens <= MAX_SPEC_TOKENS:
        raise ValueError(f"spec_tokens={spec_tokens!r}: expected an integer in [0, {MAX_SPEC_TOKENS}] "
                         "(speculative tokens per step; real configs use a handful)")
    for name, dtype in (("state dtype", state_dtype), ("conv dtype", conv_dtype)):
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"{name}={dtype!r}: expected float32, bfloat16 or float16")
    r = model.recurrent
    if isinstance(r, GdnDims):
        ssm_shape = (r.num_v_heads // tp, r.head_v_dim, r.head_k_dim)
        conv_channels = (2 * r.num_k_heads * r.head_k_dim + r.num_v_heads * r.head_v_dim) // tp
    else:
        groups = r.n_groups // tp if r.n_groups % tp == 0 else 1  # a single group is replicated
        ssm_shape = (r.num_heads // tp, r.head_dim, r.state_size)
        conv_channels = r.num_heads * r.head_dim // tp + 2 * groups * r.state_size
    conv_shape = (conv_channels, r.conv_kernel - 1 + spec_tokens)
    return StatePage(ssm_shape, conv_shape,
                     _prod(ssm_shape) * DTYPE_BYTES[state_dtype],
                     _prod(conv_shape) * DTYPE_BYTES[conv_dtype])


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unified_block_size(state_page_bytes: int, kv_bytes: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` tokens whose attention page holds the state page."""
    for name, value in (("state_page_bytes", state_page_bytes), ("kv_bytes", kv_bytes),
                        ("alignment", alignment)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected a positive integer")
    aligned_page = alignment * kv_bytes
    return alignment * -(-state_page_bytes // aligned_page)


@dataclass(frozen=True)
class BlockPlan:
    """Everything `plan_blocks` decided, per layer and per rank unless named otherwise."""

    model_type: str
    tp: int
    kv_dtype: str
    decision: StateDtypeDecision
    alignment: int
    alignment_source: str
    kv_bytes_per_token: int
    state: StatePage
    block_size: int
    num_recurrent_layers: int
    recurrent_kind: str

    @property
    def attention_page_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    @property
    def state_padding_bytes(self) -> int:
        """Bytes the state page is padded by to equal the attention page."""
        return self.attention_page_bytes - self.state.total_bytes

    @property
    def state_bytes_per_sequence(self) -> int:
        """Unpadded state of one sequence over all recurrent layers, on one rank."""
        return self.state.total_bytes * self.num_recurrent_layers

    @property
    def padded_state_bytes_per_sequence(self) -> int:
        """The same, with each layer's state page padded to the attention page (what is allocated)."""
        return self.attention_page_bytes * self.num_recurrent_layers


def plan_blocks(config: Mapping | ModelConfig, state_dtype: str, platform: str, kv_dtype: str,
                tp: int, spec_tokens: int = 0) -> BlockPlan:
    """Decide the state dtype (`decide_state_dtype`) and the unified block size for it."""
    model = config if isinstance(config, ModelConfig) else parse_config(config)
    check_tp(tp)
    decision = decide_state_dtype(model, state_dtype, platform, tp)
    device = device_of(platform)
    kv = kv_bytes_per_token(model, tp, kv_dtype)
    page = state_page(model, tp, decision.state_dtype, decision.conv_dtype, spec_tokens)
    alignment = BLOCK_ALIGNMENT[device]
    return BlockPlan(model.model_type, tp, kv_dtype, decision, alignment, ALIGNMENT_SOURCE[device],
                     kv, page, unified_block_size(page.total_bytes, kv, alignment),
                     model.num_recurrent_layers, model.recurrent_kind)
