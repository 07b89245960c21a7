"""TurboQuant driver: run a cell's op through an implementation with the reference's signatures.

``impl`` has ``store(kv_cache, key, value, slot_mapping, preset, layout, rotation)`` and
``decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=, sinks=)`` as in
``reference.turboquant.numpy_ref``. An implementation of the "act-sdpa" model (``reads_unquantized``
true: torch-sdpa and its planted-bug reference) never reads the quantized cache: its decode gets the unquantized one in that argument, K and V
concatenated on the last axis, float32 ``[num_blocks, block_size, Hk, 2 D]``. ``store`` either writes the cache in place and returns None
(NumPy form) or returns the new cache (JAX form, or a copy back from a device).

Outputs: ``{"kv_cache": uint8 cache}`` (store ops), ``{"out": [B, Hq, D]}`` (decode ops) in the dtype the
implementation returned (float32 or the activation dtype; the check refuses any other).
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell


def run_with(impl, cell: Cell, inputs: dict) -> dict:
    """Run the cell's op (store, decode, or store then decode) through ``impl``; the outputs dict."""
    out = {}
    cache = inputs["kv_cache"]
    common = (inputs["preset"], inputs["layout"], inputs["rotation"])
    if cell.op in ("store", "store_decode"):
        result = impl.store(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], *common)
        cache = cache if result is None else result
        out["kv_cache"] = np.asarray(cache)
    if cell.op in ("decode", "store_decode"):
        if getattr(impl, "reads_unquantized", False):
            cache = np.concatenate([inputs["key_cache"], inputs["value_cache"]], axis=-1)
        o = impl.decode(inputs["query"], cache, inputs["block_table"], inputs["seq_lens"], *common,
                        scale=inputs["scale"], sinks=inputs["sinks"])
        out["out"] = np.asarray(o)
    return out
