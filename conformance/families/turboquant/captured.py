"""TurboQuant inputs from a file (``conformance.inputs.captured``): an op's arguments, keyed by the
reference's names.

    store:         kv_cache, key, value, slot_mapping; rotation
    decode:        query, kv_cache, block_table, seq_lens; rotation, sinks
    store_decode:  the decode's and key, value, slot_mapping (this step's tokens, stored first)

kv_cache uint8 [num_blocks, block_size, Hk, slot_size]; query [B,Hq,D], key and value [N,Hk,D] of one
activation dtype (bfloat16, float16, float32); block_table [B,M], seq_lens [B], slot_mapping [N]
(-1: a token not stored), int32 or int64; rotation float32 [D,D] for MSE-key presets (absent for
turboquant_k8v4, whose keys are not rotated); sinks float32 [Hq] (optional). Strings (optional):
preset, layout ("aos" or "soa"), scale (decode ops: a decimal number; default 1/sqrt(D)).

The preset is the one whose slot size for D is the cache's last dimension (the presets' sizes
differ for every D); a named one must agree. The layout, when not named, is the one under which
every (token, kv head) already stored (the sequences' tokens, less those the op stores) reads finite
fp16 scalars and non-negative k_norm and v_scale (``identify_layout``); a store, or a cache both or
neither layout reads so, must name it. Tables and shapes are checked by
``reference.turboquant.validate``, in the order that bounds what is read: ``check_headers`` takes the
members' shapes and dtypes from the file's headers (each against the others: ``SHAPES``; the slot size
against D), ``check_tables`` the index tables (read first, small) against the cache's and the query's
shapes, and ``derive`` the rest once everything is read. The file holds no unquantized keys and values:
the backends that attend over those skip, and the record reports no quantization error.

The cell's params, as the matrix's cells of the op: preset, layout, Hk, then bs and ntok (store) or
G, bs, lens (seq_lens), then rotation ("hadamard" when R is the reference's Hadamard, "none" for
FP8 keys, else "random"), sinks (decode ops), D, act.
"""
from __future__ import annotations

import numpy as np

from conformance.families.turboquant.inputs import token_slots
from conformance.inputs.checks import InputsError, check_keys, check_shapes, dtype_in, index_dtype, index_table
from conformance.numerics import ACTIVATIONS
from reference.turboquant import numpy_ref, rotation, validate
from reference.turboquant.layout import LAYOUTS, check_layout
from reference.turboquant.presets import PRESETS, Preset, check_head_size, preset as lookup

_STORE = ("kv_cache", "key", "value", "slot_mapping")
_DECODE = ("query", "kv_cache", "block_table", "seq_lens")
KEYS = {"store": _STORE, "decode": _DECODE, "store_decode": _DECODE + _STORE[1:]}
OPS = tuple(KEYS)
OPTIONAL_KEYS = {"store": ("rotation",), "decode": ("rotation", "sinks"), "store_decode": ("rotation", "sinks")}
STRINGS = {"store": ("preset", "layout"), "decode": ("preset", "layout", "scale"),
           "store_decode": ("preset", "layout", "scale")}
TABLES = ("block_table", "seq_lens", "slot_mapping")
# every member's shape in the dimensions of ``reference.turboquant.validate``
SHAPES = {"query": ("B", "Hq", "D"), "kv_cache": ("num_blocks", "block_size", "Hk", "slot_size"),
          "block_table": ("B", "M"), "seq_lens": ("B",), "key": ("N", "Hk", "D"), "value": ("N", "Hk", "D"),
          "slot_mapping": ("N",), "rotation": ("D", "D"), "sinks": ("Hq",)}


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


def identify_layout(kv_cache: np.ndarray, slots: np.ndarray, p: Preset, D: int) -> str:
    """The one layout that reads finite fp16 scalars, k_norm and v_scale >= 0, at every stored flat
    slot of ``slots``; InputsError naming ``layout`` when both or neither do."""
    fits = [lay for lay in LAYOUTS if slots.size and _plausible(kv_cache, slots, p, lay, D)]
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


def _rotation_given(p: Preset, R, D: int) -> None:
    """InputsError naming ``rotation`` unless R (an array or a header) is absent for FP8 keys, float32 otherwise."""
    if p.key_fp8:
        if R is not None:
            raise InputsError(f"rotation: {p.name} keys are FP8, not rotated; expected no rotation")
        return
    if R is None:
        raise InputsError(f"rotation: missing; expected float32 [D={D}, D] (the R the {p.name} cache was stored with)")
    dtype_in("rotation", R, ("float32",))


def _rotation(p: Preset, R, D: int) -> str:
    """The cell's rotation param of R (checked: absent for FP8 keys, float32 otherwise)."""
    _rotation_given(p, R, D)
    if p.key_fp8:
        return "none"
    is_hadamard = R.shape == (D, D) and D & (D - 1) == 0 and np.array_equal(R, rotation.hadamard(D))
    return "hadamard" if is_hadamard else "random"


def _stored(cache, table, lens, slot_mapping) -> np.ndarray:
    """Flat slots the sequences' tokens hold before the op, less those it stores."""
    slots = np.concatenate(token_slots(table, lens, cache.shape[1]))
    return slots if slot_mapping is None else np.setdiff1d(slots, slot_mapping[slot_mapping >= 0])


def keys(op: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The arrays ``op``'s file must hold, those it may hold, and the strings it may hold."""
    return KEYS[op], OPTIONAL_KEYS[op], STRINGS[op]


def check_headers(op: str, members: dict) -> None:
    """InputsError/ValueError/TypeError naming the member unless the shapes and dtypes of ``op``'s members
    (anything with a shape and a dtype: a file's headers, no data read) agree with each other."""
    first = "query" if op != "store" else "key"
    act = dtype_in(first, members[first], ACTIVATIONS)
    for name in (n for n in ("key", "value") if n in KEYS[op] and n != first):
        dtype_in(name, members[name], (act,), f" (the dtype of {first})")
    dtype_in("kv_cache", members["kv_cache"], ("uint8",))
    for name in (n for n in TABLES if n in members):
        index_dtype(name, members[name])
    if "sinks" in members:
        dtype_in("sinks", members["sinks"], ("float32",))
    dims = check_shapes(members, {name: SHAPES[name] for name in KEYS[op] + OPTIONAL_KEYS[op]})
    D = check_head_size(dims["D"])
    p = preset_of(D, dims["slot_size"], None)
    _rotation_given(p, members.get("rotation"), D)
    if op != "store":
        validate.query_heads(dims["Hq"], dims["Hk"])


def check_tables(op: str, members: dict, tables: dict) -> None:
    """ValueError naming the table unless the index tables' values (``tables``, read) agree with the other
    members' shapes (``members``, as ``check_headers`` passed them): used blocks and slots lie in the cache,
    sequences within their block tables."""
    num_blocks, block_size = members["kv_cache"].shape[:2]
    if op != "store":
        validate.tables(tables["block_table"], tables["seq_lens"], num_blocks, block_size, members["query"].shape[0])
    if op != "decode":
        validate.slot_table(tables["slot_mapping"], members["key"].shape[0], num_blocks, block_size)


def derive(op: str, arrays: dict, strings: dict) -> tuple[dict, dict]:
    """(cell params, inputs) of a file of ``op``'s arguments; InputsError/ValueError/TypeError naming the key."""
    if op not in OPS:
        raise InputsError(f"op: turboquant/{op} does not take a file; expected one of {', '.join(OPS)}")
    check_keys(arrays, strings, *keys(op))
    check_headers(op, arrays)
    reads, stores = op != "store", op != "decode"
    first = "query" if reads else "key"
    act = arrays[first].dtype.name
    validate.floats(first, arrays[first], 3, "[B, Hq, D]" if reads else "[N, Hk, D]")
    D = arrays[first].shape[-1]
    cache = arrays["kv_cache"]
    num_blocks, bs, Hk, slot_size = validate.cache_dims(cache)
    p = preset_of(D, slot_size, strings.get("preset"))
    R = arrays.get("rotation")
    rot = _rotation(p, R, D)
    inputs = {"preset": p.name, "rotation": R, "kv_cache": cache}
    if stores:
        inputs.update(key=arrays["key"], value=arrays["value"],
                      slot_mapping=index_table("slot_mapping", arrays["slot_mapping"], np.int64))
    if reads:
        table = index_table("block_table", arrays["block_table"], np.int32)
        lens = index_table("seq_lens", arrays["seq_lens"], np.int32)
        validate.tables(table, lens, num_blocks, bs, arrays["query"].shape[0])
        inputs.update(query=arrays["query"], block_table=table, seq_lens=lens, scale=_scale(strings.get("scale"), D),
                      sinks=arrays.get("sinks"))
    layout = strings.get("layout")
    if layout is not None:
        inputs["layout"] = check_layout(layout)
    elif not reads:
        raise InputsError(f"layout: a store's cache does not show its layout; expected the string layout "
                          f"({' or '.join(LAYOUTS)})")
    else:
        inputs["layout"] = identify_layout(cache, _stored(cache, table, lens, inputs.get("slot_mapping")), p, D)
    if stores:
        validate.store_args(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], p.name, inputs["layout"], R)
    if reads:
        validate.decode_args(inputs["query"], cache, table, lens, p.name, inputs["layout"], R, inputs["scale"],
                             inputs["sinks"], 1)
        shape = dict(G=arrays["query"].shape[1] // Hk, bs=bs, lens=tuple(int(n) for n in lens))
        tail = dict(rotation=rot, sinks=inputs["sinks"] is not None)
    else:
        shape, tail = dict(bs=bs, ntok=int(arrays["key"].shape[0])), dict(rotation=rot)
    params = dict(preset=p.name, layout=inputs["layout"], Hk=Hk, **shape, **tail, D=D, act=act)
    return params, inputs
