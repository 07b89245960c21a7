"""Which GDN/Mamba state dtype a serving engine actually uses, and why.

Models vLLM's CPU-platform rule (``CpuPlatform.check_and_update_config``; vLLM PR #52191,
"[CPU] Support FP16/BF16 persisted GDN state on AMX"):

- On a CPU with AVX-512 BF16 (the CPUs whose AMX GDN kernels use a ``state_t`` template), the
  platform used to reset ``mamba_ssm_cache_dtype`` to float32 unconditionally. Now a float16 or
  bfloat16 request is kept only when the model is recognised as running the accelerated GDN
  backend: its layers include ``linear_attention``, a state-dtype contract resolves for it, and the
  SSM dtype that contract declares for the request (the second element of the
  ``(conv_dtype, ssm_dtype)`` pair, like ``get_mamba_state_dtype_from_config``) equals the request.
  Every other case (``auto``, mamba-only models such as nemotron_h, no contract, a contract that
  declares something else) falls back to float32, with the reason.
- A GPU, and a CPU without AVX-512 BF16, reset nothing: the model's contract resolves the dtype.

Dtypes are the strings ``float32``, ``bfloat16``, ``float16``; requests may also be ``auto``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from planner.model_configs import STATE_DTYPE_CHOICES, ModelConfig, parse_config

REQUESTS = ("auto",) + STATE_DTYPE_CHOICES
PLATFORMS = ("cpu-avx512bf16", "cpu", "gpu")

Contract = Callable[[ModelConfig, str], tuple[str, str]]


def declared_state_dtypes(model: ModelConfig, requested: str) -> tuple[str, str]:
    """The ``(conv_dtype, ssm_dtype)`` pair a model declares for a requested SSM dtype.

    Mirrors vLLM's ``MambaStateDtypeCalculator`` plus the Qwen3.5 config hook (``auto`` reads the
    checkpoint's ``mamba_ssm_dtype``): the conv state follows the model dtype; the SSM state is the
    explicit request, else the dtype the checkpoint declares, else the model dtype.
    """
    ssm = requested if requested != "auto" else (model.declared_ssm_dtype or model.model_dtype)
    return model.model_dtype, ssm


def nemotron_h_state_dtypes(model: ModelConfig, requested: str) -> tuple[str, str]:
    """NemotronH's hook (vLLM PR #39032): ``auto`` without a declared dtype means float32."""
    if requested == "auto" and model.declared_ssm_dtype is None:
        return model.model_dtype, "float32"
    return declared_state_dtypes(model, requested)


# model_type -> contract: the models whose state-dtype contract we know (vLLM resolves the model class
# through its registry and asks it; this table is our stand-in for that registry).
CONTRACTS: Mapping[str, Contract] = {
    "qwen3_next": declared_state_dtypes,
    "qwen3_5": declared_state_dtypes,
    "qwen3_5_moe": declared_state_dtypes,
    "nemotron_h": nemotron_h_state_dtypes,
}


@dataclass(frozen=True)
class StateDtypeDecision:
    """requested: what the user asked; state_dtype / conv_dtype: what is stored;
    reset: True when the platform overrode the model's dtype with float32; reason: why, in words."""

    requested: str
    platform: str
    state_dtype: str
    conv_dtype: str
    reset: bool
    reason: str


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value  # type: ignore[return-value]


def decide_state_dtype(config: Mapping | ModelConfig, requested: str, platform: str, tp: int,
                       contracts: Mapping[str, Contract] = CONTRACTS) -> StateDtypeDecision:
    """Decide the stored state dtype for ``config`` (a config.json dict or a parsed ModelConfig).

    ``requested``: auto | float32 | bfloat16 | float16 (``--mamba-ssm-cache-dtype``);
    ``platform``: cpu-avx512bf16 | cpu | gpu; ``tp``: tensor-parallel size (the recurrent heads must
    shard evenly, else ValueError); ``contracts``: model_type -> contract (tests inject broken ones).
    """
    _check_choice("requested state dtype", requested, REQUESTS)
    _check_choice("platform", platform, PLATFORMS)
    model = config if isinstance(config, ModelConfig) else parse_config(config)
    model.check_recurrent_tp(tp)
    contract = contracts.get(model.model_type)

    def decision(state: str, conv: str, reset: bool, reason: str) -> StateDtypeDecision:
        return StateDtypeDecision(requested, platform, state, conv, reset, reason)

    if platform != "cpu-avx512bf16":
        where = "a GPU" if platform == "gpu" else "a CPU without AVX-512 BF16"
        if contract is None:
            raise ValueError(f"no state-dtype contract for model_type {model.model_type!r}: "
                             f"expected one of {', '.join(sorted(contracts))}")
        conv, ssm = contract(model, requested)
        how = "as requested" if requested != "auto" else "auto resolved by the model's contract"
        return decision(ssm, conv, False, f"{where} resets nothing: state dtype {ssm} ({how})")

    conv = model.model_dtype
    if requested == "float32":
        return decision("float32", conv, False, "float32 requested: nothing to reset")
    if requested == "auto":
        return decision("float32", conv, True,
                        "auto on an AVX-512 BF16 CPU resets to float32: only an explicit bfloat16 "
                        "or float16 request can keep a low-precision state")
    if "linear_attention" not in model.layer_types:
        return decision("float32", conv, True,
                        f"{requested} not kept: the model has no linear_attention layer "
                        f"({model.model_type} has {model.recurrent_kind} layers only), so the AMX "
                        "GDN backend does not serve it; reset to float32")
    if contract is None:
        return decision("float32", conv, True,
                        f"{requested} not kept: no state-dtype contract resolves for model_type "
                        f"{model.model_type!r}; reset to float32")
    declared = contract(model, requested)
    if declared[1] != requested:
        return decision("float32", conv, True,
                        f"{requested} not kept: contract mismatch, the model declares "
                        f"(conv, ssm) = {declared} for this request; reset to float32")
    return decision(requested, declared[0], False,
                    f"{requested} kept: linear_attention model whose contract declares ssm "
                    f"dtype {requested} (AMX GDN kernels store state_t={requested})")
