"""TurboQuant oracles (which rounding model uses which is in ``models``); every decode oracle is
float64 attention.

"exact" and "act-mma" attend over the dequantized cache (``numpy_ref.dequantize``, rotated space,
``q_rot = q @ R``); "act-sdpa" over the UNQUANTIZED ``key_cache``/``value_cache`` (torch-sdpa never
reads the quantized cache). The store oracle is ``numpy_ref.store`` on a copy of the input cache.

"act-mma-table" attends over the cache dequantized through the centroid table rounded to the
activation dtype (``key_table``), with exact values.

The activation dtype ``act`` is the query's (``act_of``); "act-mma", "act-mma-table" and "act-sdpa" round
where their kernels do to that dtype and take its unit roundoff ``numerics.UNIT[act]``. For float32 activations
that is float32: "act-mma" means fp32 MMA operands (its oracle is the exact one, its tolerance the exact
one plus u32 terms), "act-sdpa" float32 SDPA. A kernel whose MMA takes only 16-bit operands skips
float32 cells (its backend's ``supports`` says so) rather than rounding them to 16 bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.families.turboquant.inputs import token_slots
from conformance.families.turboquant.tolerances import attention_atol, decode_tolerance
from conformance.compare import Tolerance
from conformance.numerics import ACTIVATIONS, UNIT, to_activation
from conformance.rounding import RoundingModel
from reference.turboquant import numpy_ref

@dataclass(frozen=True)
class DecodeOracle:
    """What a decode oracle attends over: the dequantized cache (``quantized``) or the unquantized
    keys and values, and whether it rounds q_rot, K and V to the activation dtype first
    (``rounds_operands``), or q_rot and the centroid table the keys are dequantized through (``rounds_table``;
    values exact)."""

    name: str
    quantized: bool
    rounds_operands: bool = False
    rounds_table: bool = False


DEQUANTIZED = DecodeOracle("dequantized", quantized=True)
DEQUANTIZED_ACT = DecodeOracle("dequantized, operands in the activation dtype", quantized=True, rounds_operands=True)
DEQUANTIZED_TABLE = DecodeOracle("dequantized through the centroid table in the activation dtype, exact values",
                                 quantized=True, rounds_table=True)
UNQUANTIZED = DecodeOracle("unquantized", quantized=False)


def act_of(inputs: dict) -> str:
    """The activation dtype of a decode's inputs: the query's (a name of ``numerics.ACTIVATIONS``)."""
    name = np.asarray(inputs["query"]).dtype.name
    if name not in ACTIVATIONS:
        raise ValueError(f"query: dtype {name} is not an activation dtype ({', '.join(ACTIVATIONS)})")
    return name


def expected_cache(inputs: dict) -> np.ndarray:
    """The cache after ``numpy_ref.store`` of the inputs' tokens (on a copy)."""
    cache = inputs["kv_cache"].copy()
    numpy_ref.store(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], inputs["preset"],
                    inputs["layout"], inputs["rotation"])
    return cache


def folded_norm(inputs: dict, key_codes: np.ndarray, p) -> np.ndarray:
    """fp16 ``||k|| / sqrt(sum_j c[idx_j]^2 + 1e-16)`` (float64) of the stored keys for the given
    codes ``[n, Hk, D]``: what an SoA norm-corrected store writes for those codes."""
    k = inputs["key"][inputs["slot_mapping"] >= 0].astype(np.float64)
    c = numpy_ref.centroids(p.key_bits, k.shape[-1]).astype(np.float64)[key_codes]
    return (np.linalg.norm(k, axis=-1) / np.sqrt(np.sum(c * c, axis=-1) + 1e-16)).astype(np.float16)


def attention64(q, keys, values, G: int, scale: float, sinks) -> np.ndarray:
    """float64 softmax attention: q [B, Hq, D]; keys/values lists of [L_b, Hk, D]; sinks [Hq] or None."""
    out = np.empty(q.shape, dtype=np.float64)
    for b, (k, v) in enumerate(zip(keys, values)):
        k = np.repeat(np.asarray(k, np.float64), G, axis=1)
        v = np.repeat(np.asarray(v, np.float64), G, axis=1)
        x = scale * np.einsum("hd,thd->ht", q[b], k)
        m = x.max(axis=1)
        if sinks is not None:
            m = np.maximum(m, sinks)
        e = np.exp(x - m[:, None])
        denom = e.sum(axis=1) + (np.exp(sinks - m) if sinks is not None else 0.0)
        out[b] = np.einsum("ht,thd->hd", e, v) / denom[:, None]
    return out


def dequantized(inputs: dict, cache, table=None) -> tuple[list, list]:
    """Rotated-space keys and values per sequence, float32, from ``cache`` (keys through ``table``, None:
    the preset's centroids)."""
    return numpy_ref.dequantize(cache, inputs["block_table"], inputs["seq_lens"], inputs["preset"],
                                inputs["layout"], inputs["rotation"], rotated=True, key_table=table)


def key_table(preset: str, D: int, act: str) -> np.ndarray | None:
    """The preset's centroid table for head size ``D`` rounded to the activation dtype ``act``, as float32;
    None for FP8 keys (no table; E4M3 values are exact in every activation dtype)."""
    from reference.turboquant.presets import preset as lookup

    p = lookup(preset)
    return None if p.key_fp8 else to_activation(numpy_ref.centroids(p.key_bits, D), act).astype(np.float32)


def unquantized(inputs: dict) -> tuple[list, list]:
    """The unquantized keys and values per sequence (float32 [L_b, Hk, D])."""
    _, bs, Hk, D = inputs["key_cache"].shape
    kc, vc = inputs["key_cache"].reshape(-1, Hk, D), inputs["value_cache"].reshape(-1, Hk, D)
    slots = token_slots(inputs["block_table"], inputs["seq_lens"], bs)
    return [kc[s] for s in slots], [vc[s] for s in slots]


def rotated_query(inputs: dict, dtype=np.float64) -> np.ndarray:
    """``q @ R`` computed in ``dtype`` (FP8-key presets: q itself, unrotated)."""
    return numpy_ref.rotate_query(inputs["query"], inputs["preset"], inputs["rotation"], dtype)


def _sinks64(inputs: dict):
    return None if inputs["sinks"] is None else np.asarray(inputs["sinks"], np.float64)


def decode_oracle(model: RoundingModel, op: str, inputs: dict, cache, G: int) -> tuple[np.ndarray, Tolerance]:
    """(expected output float64 [B, Hq, D], Tolerance) of a decode over ``cache`` by a backend of
    ``model`` on ``op``: the model's oracle (``DecodeOracle``) and the tolerance terms it adds."""
    scale, sinks = inputs["scale"], _sinks64(inputs)
    L_max = int(np.max(inputs["seq_lens"]))
    act = act_of(inputs)
    how, terms = model.oracle_on(op, DEQUANTIZED), model.terms_on(op)
    if not how.quantized:
        q = inputs["query"].astype(np.float64)
        keys, values = unquantized(inputs)
        tol = decode_tolerance(terms, *attention_atol(q, keys, values, G, scale, L_max), UNIT[act])
        return attention64(q, keys, values, G, scale, sinks), tol
    table = key_table(inputs["preset"], inputs["query"].shape[-1], act) if how.rounds_table else None
    keys, values = dequantized(inputs, cache, table)
    q_rot = rotated_query(inputs)
    tol = decode_tolerance(terms, *attention_atol(q_rot, keys, values, G, scale, L_max), UNIT[act])
    if how.rounds_operands or how.rounds_table:
        q_rot = to_activation(rotated_query(inputs, np.float32), act).astype(np.float64)
    if how.rounds_operands:
        keys, values = [to_activation(k, act) for k in keys], [to_activation(v, act) for v in values]
    return attention64(q_rot, keys, values, G, scale, sinks), tol


def dequantized_vs_unquantized(inputs: dict, cache, G: int) -> tuple[np.ndarray, np.ndarray]:
    """(float64 attention over the dequantized cache, over the unquantized one): the preset's error."""
    sinks = _sinks64(inputs)
    keys, values = dequantized(inputs, cache)
    deq = attention64(rotated_query(inputs), keys, values, G, inputs["scale"], sinks)
    uk, uv = unquantized(inputs)
    return deq, attention64(inputs["query"].astype(np.float64), uk, uv, G, inputs["scale"], sinks)
