"""Cells in a real model's shapes (``kernel-lab conform --model NAME`` / ``--config config.json``).

A model's ``config.json`` (parsed by ``planner.model_configs``, plus ``num_attention_heads``) gives:

- gdn: its linear-attention layers' key heads H, value heads HV, key and value head sizes K, V
  (whole model, tensor parallel 1): gating, recurrent, chunked (one call and a two-call split),
  decode and spec decode cells, bf16 and fp32 state pools, padded and shuffled slots;
- turboquant: its full-attention layers' KV heads Hk, query heads per KV head G and head size D:
  store, decode (with and without sinks) and store+decode cells of every preset and both layouts.

Every cell's activations come in the model's ``torch_dtype`` (``dtype`` in newer configs; bfloat16
when it names no activation dtype, e.g. an fp8 checkpoint). A model without linear-attention layers (Nemotron-H: Mamba2) adds no gdn
cells. The same shapes in every tier (the tier's own cells carry the size sweeps); one seed.
"""
from __future__ import annotations

from typing import Mapping

from conformance.cells import Cell, make_cell


def _config(model: str | None, path: str | None) -> dict:
    from planner import model_configs

    if (model is None) == (path is None):
        raise ValueError("give one of model (a shipped config name) or path (a config.json)")
    return model_configs.shipped_config(model) if model else model_configs.read_config(path)


def activation_of(config: Mapping) -> str:
    """The activation dtype a config names (``torch_dtype`` or ``dtype``, top level or its text_config)."""
    from conformance.numerics import ACTIVATIONS

    for fields in (config.get("text_config", {}), config):
        for key in ("torch_dtype", "dtype"):
            if fields.get(key) in ACTIVATIONS:
                return fields[key]
    return "bfloat16"


def _gdn(dims, act: str) -> list[Cell]:
    from conformance.families.gdn import matrix as gdn

    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
    out = [make_cell("gdn", "gating", HV=HV, T=65, act=act)]
    for state, slots in (("bfloat16", "padded"), ("float32", "shuffled")):
        heads, tail = dict(state=state, heads=(H, HV)), dict(decay="weak", slots=slots, qk="unit")
        if V == K:  # the varlen ops take V = K; decode covers V != K
            out += [
                gdn.cell_of("recurrent", dict(**heads, K=K, lens=(63, 64, 65), **tail, interval=64, act=act)),
                gdn.cell_of("chunked", dict(**heads, K=K, lens=(127, 128, 129), **tail, split=None, act=act)),
                gdn.cell_of("chunked", dict(**heads, K=K, lens=(273,), **tail, split=100, act=act)),
                gdn.cell_of("spec_decode", dict(**heads, K=K, drafts=(4, 2), accepted="mix", **tail, act=act)),
            ]
        out.append(gdn.cell_of("decode", dict(**heads, KV=(K, V), N=4, **tail, act=act)))
    return out


def _turboquant(fields: Mapping, Hk: int, D: int, act: str) -> list[Cell]:
    from conformance.families.turboquant import matrix as tq

    Hq = fields.get("num_attention_heads")
    if not isinstance(Hq, int) or Hq <= 0 or Hq % Hk:
        raise ValueError(f"config num_attention_heads={Hq!r}: expected a positive multiple of "
                         f"num_key_value_heads={Hk}")
    G = Hq // Hk
    out = []
    for preset in tq.PRESET_NAMES:
        for layout in ("aos", "soa"):
            rotation = "none" if preset == "turboquant_k8v4" else "hadamard"
            out.append(tq.store_cell(preset, layout, Hk, 16, 33, rotation, D=D, act=act))
            out.append(tq.decode_cell("decode", preset, layout, (Hk, G), 16, (65, 17, 1), rotation, False, D=D,
                                      act=act))
            out.append(tq.decode_cell("store_decode", preset, layout, (Hk, G), 32, (40, 9), rotation, True, D=D,
                                      act=act))
    return out


def for_model(model: str | None = None, path: str | None = None) -> list[Cell]:
    """The model-shaped cells of a shipped model NAME or a config.json PATH (module docstring)."""
    from planner import model_configs

    config = _config(model, path)
    parsed = model_configs.parse_config(config)
    fields = config.get("text_config", config)
    out = []
    if parsed.recurrent_kind == "linear_attention":
        out += _gdn(parsed.recurrent, activation_of(config))
    out += _turboquant(fields, parsed.num_kv_heads, parsed.head_dim, activation_of(config))
    return list(dict.fromkeys(out))


def extend(cells: list[Cell], model: str | None, path: str | None, family: str | None = None,
           op: str | None = None, pattern: str | None = None,
           shard: tuple[int, int] | None = None) -> list[Cell]:
    """``cells`` plus the model's cells not already in it, filtered like the tier's (family, op,
    regular expression on the id, shard K/N: model cell i goes to shard i mod N)."""
    from conformance import patterns

    if model is None and path is None:
        return cells
    extra = [c for c in for_model(model, path) if family in (None, c.family) and op in (None, c.op)]
    if pattern:
        found = patterns.matching(pattern, [c.id for c in extra])
        extra = [c for i, c in enumerate(extra) if i in found]
    if shard is not None:
        k, n = shard
        extra = extra[k - 1::n]
    have = set(cells)
    return cells + [c for c in extra if c not in have]
