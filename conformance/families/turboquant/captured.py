"""TurboQuant inputs from a file (``conformance.captured``): the decode op's arguments, keyed by the
reference's names.

decode arrays: query [B,Hq,D] in an activation dtype (bfloat16, float16, float32); kv_cache uint8
[num_blocks, block_size, Hk, slot_size]; block_table [B,M] and seq_lens [B], int32 or int64;
rotation float32 [D,D] (MSE-key presets; absent for turboquant_k8v4, whose keys are not rotated);
sinks float32 [Hq] (optional). Strings (optional): preset, layout ("aos" or "soa"), scale (a decimal
number; default 1/sqrt(D)).

The preset is the one whose slot size for D is the cache's last dimension (the presets' sizes
differ for every D); a named one must agree. The layout, when not named, is the one under which
every stored (token, kv head) reads finite fp16 scalars and non-negative k_norm and v_scale
(``identify_layout``); a cache both or neither layout reads so must name it. Tables and shapes are
checked by ``reference.turboquant.validate``. The file holds no unquantized keys and values: the
backends that attend over those skip, and the record reports no quantization error.

The cell's params: preset, layout, Hk, G, bs, lens (seq_lens), rotation ("hadamard" when R is the
reference's Hadamard, "none" for FP8 keys, else "random"), sinks, D, act, as the matrix's decode cells.
"""
from __future__ import annotations

import numpy as np

from conformance.captured import InputsError, check_keys, dtype_in, int32_table
from conformance.families.turboquant.inputs import token_slots
from conformance.numerics import ACTIVATIONS
from reference.turboquant import numpy_ref, rotation, validate
from reference.turboquant.layout import LAYOUTS, check_layout
from reference.turboquant.presets import PRESETS, Preset, check_head_size
from reference.turboquant.presets import preset as lookup

OPS = ("decode",)
DECODE_KEYS = ("query", "kv_cache", "block_table", "seq_lens")
OPTIONAL_KEYS = ("rotation", "sinks")
STRINGS = ("preset", "layout", "scale")


def preset_of(D: int, slot_size: int, named: str | None) -> Preset:
    """The preset of a cache whose (token, kv head) slot has ``slot_size`` bytes at head size D."""
    fits = [p for p in PRESETS.values() if p.slot_size(D) == slot_size]
    if named is not None:
        p = lookup(named)
        if p not in fits:
            raise InputsError(f"kv_cache: last dimension {slot_size}, expected {p.slot_size(D)} (the slot size of "
                              f"preset {p.name} at D={D})")
        return p
    if not fits:
        sizes = ", ".join(f"{p.slot_size(D)} ({p.name})" for p in PRESETS.values())
        raise InputsError(f"kv_cache: last dimension {slot_size} is no preset's slot size at D={D}; expected {sizes}")
    return fits[0]


def _plausible(kv_cache: np.ndarray, slots: np.ndarray, p: Preset, layout: str, D: int) -> bool:
    fields = numpy_ref.read_fields(kv_cache, slots, p, layout, D)
    scalars = [fields[n].astype(np.float32) for n in ("k_norm", "v_scale", "v_zero") if n in fields]
    signed = [fields[n].astype(np.float32) for n in ("k_norm", "v_scale") if n in fields]
    return all(np.all(np.isfinite(s)) for s in scalars) and all(np.all(s >= 0) for s in signed)


def identify_layout(kv_cache: np.ndarray, block_table: np.ndarray, seq_lens: np.ndarray, p: Preset, D: int) -> str:
    """The one layout that reads finite fp16 scalars, k_norm and v_scale >= 0, at every stored
    (token, kv head); InputsError naming ``layout`` when both or neither do."""
    slots = np.concatenate(token_slots(block_table, seq_lens, kv_cache.shape[1]))
    fits = [lay for lay in LAYOUTS if _plausible(kv_cache, slots, p, lay, D)]
    if len(fits) == 1:
        return fits[0]
    why = "both read" if fits else "neither reads"
    raise InputsError(f"layout: {why} finite non-negative norms and scales at every stored token of this "
                      f"{p.name} cache; expected the string layout ({' or '.join(LAYOUTS)})")


def _scale(text: str | None, D: int) -> float:
    if text is None:
        return float(1.0 / np.sqrt(D))
    try:
        return float(text)
    except ValueError:
        raise InputsError(f"scale: {text!r} is not a number; expected a decimal such as 0.088") from None


def derive(op: str, arrays: dict, strings: dict) -> tuple[dict, dict]:
    """(cell params, inputs) of a decode file; InputsError/ValueError/TypeError naming the key."""
    if op not in OPS:
        raise InputsError(f"op: turboquant/{op} does not take a file; expected one of {', '.join(OPS)}")
    check_keys(arrays, strings, DECODE_KEYS, OPTIONAL_KEYS, STRINGS)
    query, cache = arrays["query"], arrays["kv_cache"]
    act = dtype_in("query", query, ACTIVATIONS)
    validate.floats("query", query, 3, "[B, Hq, D]")
    D = check_head_size(query.shape[-1])
    dtype_in("kv_cache", cache, ("uint8",))
    num_blocks, bs, Hk, slot_size = validate.cache_dims(cache)
    p = preset_of(D, slot_size, strings.get("preset"))
    table = int32_table("block_table", arrays["block_table"])
    lens = int32_table("seq_lens", arrays["seq_lens"])
    validate.tables(table, lens, num_blocks, bs, query.shape[0])
    R = arrays.get("rotation")
    if p.key_fp8 and R is not None:
        raise InputsError(f"rotation: {p.name} keys are FP8, not rotated; expected no rotation")
    if not p.key_fp8:
        if R is None:
            raise InputsError(f"rotation: missing; expected float32 [D={D}, D] (the R the {p.name} cache was "
                              "stored with)")
        dtype_in("rotation", R, ("float32",))
    sinks = arrays.get("sinks")
    if sinks is not None:
        dtype_in("sinks", sinks, ("float32",))
    layout = strings.get("layout")
    layout = identify_layout(cache, table, lens, p, D) if layout is None else check_layout(layout)
    scale = _scale(strings.get("scale"), D)
    validate.decode_args(query, cache, table, lens, p.name, layout, R, scale, sinks, 1)
    if p.key_fp8:
        rot = "none"
    elif R.shape == (D, D) and D & (D - 1) == 0 and np.array_equal(R, rotation.hadamard(D)):
        rot = "hadamard"
    else:
        rot = "random"
    params = dict(preset=p.name, layout=layout, Hk=Hk, G=query.shape[1] // Hk, bs=bs,
                  lens=tuple(int(n) for n in lens), rotation=rot, sinks=sinks is not None, D=D, act=act)
    inputs = {"preset": p.name, "layout": layout, "rotation": R, "query": query, "kv_cache": cache,
              "block_table": table, "seq_lens": lens, "scale": scale, "sinks": sinks}
    return params, inputs
