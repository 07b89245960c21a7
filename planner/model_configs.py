"""Model configs for the planner: a Hugging Face ``config.json`` dict, validated into `ModelConfig`.

What is read (everything else in the dict is ignored):

- ``model_type`` (top level) and, for multimodal Qwen3.5 checkpoints, the text fields from the nested
  ``text_config`` (``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration``);
- the model dtype: ``torch_dtype`` or ``dtype`` (text fields first, then top level);
- the layer kinds: ``layer_types`` (Qwen3-Next / Qwen3.5), else ``hybrid_override_pattern``
  (Nemotron-H: ``M`` mamba, ``*`` attention, ``-`` MLP, ``E`` MoE), else ``full_attention_interval``
  with ``num_hidden_layers`` (how transformers' ``Qwen3NextConfig`` derives ``layer_types``: layer i
  is full attention when ``(i + 1) % interval == 0``);
- attention: ``num_key_value_heads``, ``head_dim``;
- GDN layers (``linear_attention``): ``linear_num_key_heads``, ``linear_num_value_heads``,
  ``linear_key_head_dim``, ``linear_value_head_dim``, ``linear_conv_kernel_dim``;
- Mamba2 layers (``mamba``): ``mamba_num_heads``, ``mamba_head_dim``, ``n_groups``,
  ``ssm_state_size``, ``conv_kernel``;
- the state dtype the checkpoint declares, if any: ``mamba_ssm_dtype`` (Qwen3.5) or
  ``mamba_ssm_cache_dtype`` (Nemotron-H).

Shipped configs live in ``planner/configs/NAME.json`` (written by us from public figures, see each
file's ``_source``); `load_model` takes a NAME or a path.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

CONFIG_DIR = Path(__file__).parent / "configs"
MODEL_DTYPES = ("float32", "bfloat16", "float16")
STATE_DTYPE_CHOICES = ("float32", "bfloat16", "float16")
LAYER_KINDS = ("full_attention", "linear_attention", "mamba", "mlp", "moe")
_PATTERN_KINDS = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}


@dataclass(frozen=True)
class GdnDims:
    """Gated-delta-net layer: state ``[HV, V, K]`` per sequence, conv over ``2*H*K + HV*V`` channels."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int


@dataclass(frozen=True)
class Mamba2Dims:
    """Mamba2 layer: state ``[heads, head_dim, d_state]``, conv over ``heads*head_dim + 2*G*d_state``."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a hybrid model the state-dtype policy and the block planner need."""

    model_type: str
    model_dtype: str
    layer_types: tuple[str, ...]
    num_kv_heads: int
    head_dim: int
    recurrent: GdnDims | Mamba2Dims
    declared_ssm_dtype: str | None

    @property
    def recurrent_kind(self) -> str:
        return "linear_attention" if isinstance(self.recurrent, GdnDims) else "mamba"

    @property
    def num_attention_layers(self) -> int:
        return self.layer_types.count("full_attention")

    @property
    def num_recurrent_layers(self) -> int:
        return self.layer_types.count(self.recurrent_kind)

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank holds: ``kv/tp``, or 1 when tp > kv heads (replicated)."""
        check_tp(tp)
        kv = self.num_kv_heads
        if kv >= tp:
            if kv % tp:
                raise ValueError(f"num_key_value_heads={kv} is not divisible by tp={tp}")
            return kv // tp
        if tp % kv:
            raise ValueError(f"tp={tp} is not a multiple of num_key_value_heads={kv}: "
                             "the KV heads cannot be replicated evenly")
        return 1

    def check_recurrent_tp(self, tp: int) -> None:
        """Raise ValueError unless the recurrent heads shard evenly over ``tp`` ranks."""
        check_tp(tp)
        r = self.recurrent
        if isinstance(r, GdnDims):
            for name, heads in (("linear_num_key_heads", r.num_k_heads),
                                ("linear_num_value_heads", r.num_v_heads)):
                if heads % tp:
                    raise ValueError(f"{name}={heads} is not divisible by tp={tp}")
        else:
            if r.num_heads % tp:
                raise ValueError(f"mamba_num_heads={r.num_heads} is not divisible by tp={tp}")
            if r.n_groups % tp and r.n_groups != 1:
                raise ValueError(f"n_groups={r.n_groups} is neither divisible by tp={tp} nor 1")


def check_tp(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r}: expected a positive integer tensor-parallel size")
    return tp


# Sizes far past any released model: a config beyond them is a typo or a unit mix-up, refused
# with the limit named (the largest shipped values: head dims 256, conv width 4, 64 value heads).
LIMITS = {"head_dim": 1024, "linear_key_head_dim": 1024, "linear_value_head_dim": 1024, "mamba_head_dim": 1024,
          "ssm_state_size": 1024, "linear_conv_kernel_dim": 64, "conv_kernel": 64,
          "num_key_value_heads": 4096, "linear_num_key_heads": 4096, "linear_num_value_heads": 4096,
          "mamba_num_heads": 4096, "n_groups": 4096, "num_hidden_layers": 4096, "full_attention_interval": 4096}
MAX_SPEC_TOKENS = 256
# Head dims are whole 16-byte vectors of bf16 (multiples of 8), as every attention and linear-attention
# kernel of vLLM tiles them; a head dim of 1, 3 or 7 is a typo, not a model.
HEAD_DIM_KEYS = ("head_dim", "linear_key_head_dim", "linear_value_head_dim", "mamba_head_dim")
HEAD_DIM_MULTIPLE = 8


def _int_field(fields: Mapping, key: str) -> int:
    if key not in fields:
        raise ValueError(f"config is missing field {key!r}")
    value = fields[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config field {key!r}={value!r}: expected a positive integer")
    if key in LIMITS and value > LIMITS[key]:
        raise ValueError(f"config field {key!r}={value}: expected at most {LIMITS[key]} (no model has more; "
                         "a typo or another unit?)")
    if key in HEAD_DIM_KEYS and value % HEAD_DIM_MULTIPLE:
        raise ValueError(f"config field {key!r}={value}: expected a multiple of {HEAD_DIM_MULTIPLE} (heads are "
                         "whole 16-byte vectors of bf16 in every kernel; a typo?)")
    return value


def _dtype_field(fields: Mapping, top: Mapping) -> str:
    for source in (fields, top):
        for key in ("torch_dtype", "dtype"):
            if key in source:
                value = source[key]
                if value not in MODEL_DTYPES:
                    raise ValueError(f"config field {key!r}={value!r}: expected one of {MODEL_DTYPES}")
                return value
    raise ValueError("config is missing field 'torch_dtype' (or 'dtype'): the model dtype sets the "
                     "KV and conv-state element size")


def _layer_types(fields: Mapping) -> tuple[str, ...]:
    if "layer_types" in fields:
        kinds = fields["layer_types"]
        if not isinstance(kinds, list) or not kinds:
            raise ValueError(f"config field 'layer_types'={str(kinds)[:60]}: expected a non-empty list of "
                             f"layer kinds ({', '.join(LAYER_KINDS)})")
        wrong = next((i for i, k in enumerate(kinds) if not isinstance(k, str)), None)
        if wrong is not None:
            raise ValueError(f"config field 'layer_types': entry {wrong} is {str(kinds[wrong])[:40]}, "
                             f"not a layer kind (expected one of {', '.join(LAYER_KINDS)})")
    elif "hybrid_override_pattern" in fields:
        pattern = fields["hybrid_override_pattern"]
        bad = sorted(set(str(pattern)) - set(_PATTERN_KINDS))
        if not isinstance(pattern, str) or not pattern or bad:
            raise ValueError(f"config field 'hybrid_override_pattern'={pattern!r}: expected a "
                             f"non-empty string of {''.join(_PATTERN_KINDS)}")
        kinds = [_PATTERN_KINDS[c] for c in pattern]
    elif "full_attention_interval" in fields:
        interval = _int_field(fields, "full_attention_interval")
        n = _int_field(fields, "num_hidden_layers")
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(n)]
    else:
        raise ValueError("config is missing field 'layer_types' (or 'hybrid_override_pattern' / "
                         "'full_attention_interval')")
    unknown = sorted({k for k in kinds if k not in LAYER_KINDS}, key=str)
    if unknown:
        raise ValueError(f"config 'layer_types' has unknown kinds {unknown}: expected {LAYER_KINDS}")
    if "num_hidden_layers" in fields and len(kinds) != fields["num_hidden_layers"]:
        raise ValueError(f"config lists {len(kinds)} layer kinds but num_hidden_layers="
                         f"{fields['num_hidden_layers']}")
    return tuple(kinds)


def parse_config(config: Mapping) -> ModelConfig:
    """Validate a ``config.json`` dict; ValueError names the first missing or bad field."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config: expected a dict (parsed config.json), got {type(config).__name__}")
    if not isinstance(config.get("model_type"), str):
        raise ValueError("config is missing field 'model_type'")
    fields = config.get("text_config", config)
    if not isinstance(fields, Mapping):
        raise ValueError("config field 'text_config': expected a dict")
    kinds = _layer_types(fields)
    if "full_attention" not in kinds:
        raise ValueError("config has no full_attention layer: there is no attention page to unify "
                         "with the state page")
    if "linear_attention" in kinds and "mamba" in kinds:
        raise ValueError("config mixes linear_attention and mamba layers: one recurrent kind expected")
    if "linear_attention" in kinds:
        recurrent: GdnDims | Mamba2Dims = GdnDims(
            *(_int_field(fields, k) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                              "linear_key_head_dim", "linear_value_head_dim",
                                              "linear_conv_kernel_dim")))
    elif "mamba" in kinds:
        recurrent = Mamba2Dims(*(_int_field(fields, k) for k in (
            "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")))
    else:
        raise ValueError("config has no linear_attention or mamba layer: no recurrent state to plan")
    if recurrent.conv_kernel < 2:
        raise ValueError(f"conv kernel width {recurrent.conv_kernel}: expected at least 2")
    declared = fields.get("mamba_ssm_dtype", fields.get("mamba_ssm_cache_dtype"))
    if declared is not None and declared not in STATE_DTYPE_CHOICES:
        raise ValueError(f"config declares state dtype {declared!r}: expected one of {STATE_DTYPE_CHOICES}")
    return ModelConfig(
        model_type=config["model_type"],
        model_dtype=_dtype_field(fields, config),
        layer_types=kinds,
        num_kv_heads=_int_field(fields, "num_key_value_heads"),
        head_dim=_int_field(fields, "head_dim"),
        recurrent=recurrent,
        declared_ssm_dtype=declared,
    )


def model_names() -> tuple[str, ...]:
    """Names of the shipped configs (``planner/configs/NAME.json``)."""
    return tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))


def read_config(path: str | Path) -> dict:
    """Read a ``config.json`` file; a missing or malformed file is a ValueError naming it."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"config {path}: not a regular file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"config {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"config {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ValueError(f"config {path} is not valid JSON: nested too deeply") from None
    if not isinstance(config, dict):
        raise ValueError(f"config {path}: expected a JSON object")
    return config


def shipped_config(name: str) -> dict:
    """The shipped config dict for a model NAME such as ``qwen3-next-80b-a3b``."""
    if name not in model_names():
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(model_names())}")
    return read_config(CONFIG_DIR / f"{name}.json")
