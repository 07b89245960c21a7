"""The TurboQuant rounding models, one record each (``conformance.rounding.RoundingModel``): the
decode oracle a backend of the model is held to, the tolerance terms it adds, where it differs from
exact, and the NumPy implementation that computes like it (the base of its planted-bug runs).
``ROUNDING_MODELS`` is derived from them.
"""
from __future__ import annotations

import numpy as np

from conformance.families.turboquant import tolerances as tol
from conformance.families.turboquant.oracle import (DEQUANTIZED_ACT, DEQUANTIZED_TABLE, UNQUANTIZED, attention64,
                                                    key_table, unquantized)
from conformance.rounding import RoundingModel, by_name, lookup
from reference.turboquant import numpy_ref


class ActMmaReference:
    """``reference.turboquant.numpy_ref`` whose decode rounds q_rot, the dequantized K and V to the query's
    dtype (float64 attention over them; a float32 query rounds nothing): the base implementation of the
    "act-mma" model. ``table=True``: q_rot and the centroid table the keys are dequantized through are
    rounded instead, the values kept exact (the "act-mma-table" model)."""

    def __init__(self, table: bool = False):
        self.table = table

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    def decode(self, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        act = np.asarray(query).dtype

        def rounded(x):
            return np.asarray(x, np.float32).astype(act).astype(np.float64)

        table = key_table(preset, np.shape(query)[-1], act.name) if self.table else None
        keys, values = numpy_ref.dequantize(kv_cache, block_table, seq_lens, preset, layout, rotation, rotated=True,
                                            key_table=table)
        if not self.table:
            keys, values = [rounded(k) for k in keys], [rounded(v) for v in values]
        q_rot = numpy_ref.rotate_query(query, preset, rotation)
        scale = 1.0 / np.sqrt(q_rot.shape[-1]) if scale is None else scale
        G = q_rot.shape[1] // kv_cache.shape[2]
        out = attention64(rounded(q_rot), keys, values, G, scale, None if sinks is None else np.asarray(sinks, np.float64))
        return out.astype(np.float32)


class ActSdpaReference:
    """``reference.turboquant.numpy_ref`` whose decode is float64 attention over the UNQUANTIZED
    cache (``reads_unquantized``: ``run_with`` passes it as ``kv_cache``, float32 ``[num_blocks,
    block_size, Hk, 2 D]``, K then V; preset, layout and rotation unused), as torch-sdpa computes:
    the base implementation of the "act-sdpa" model."""

    reads_unquantized = True

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        q = np.asarray(query, np.float64)
        D = q.shape[-1]
        keys, values = unquantized({"key_cache": kv_cache[..., :D], "value_cache": kv_cache[..., D:],
                                    "block_table": np.asarray(block_table), "seq_lens": np.asarray(seq_lens)})
        scale = 1.0 / np.sqrt(D) if scale is None else scale
        out = attention64(q, keys, values, q.shape[1] // kv_cache.shape[2], scale,
                          None if sinks is None else np.asarray(sinks, np.float64))
        return out.astype(np.float32)


def _numpy_ref():
    return numpy_ref


MODELS = by_name((
    RoundingModel("exact", "fp32 math on the dequantized cache (the references, fp32 kernels, the Triton "
                  "interpreter)", _numpy_ref, differs_on=None),
    RoundingModel("act-mma", "MMA operands (q_rot, dequantized K and V, P) in the activation dtype with fp32 "
                  "accumulation (GPU kernels; float32 activations: fp32 operands)", ActMmaReference,
                  differs_on=("decode", "store_decode"), oracle={"*": DEQUANTIZED_ACT},
                  terms={"*": (tol.DECODE_ACT_MMA,)}),
    RoundingModel("act-mma-table", "MMA operands from the centroid table: q_rot and the table in the activation "
                  "dtype (the fp16 norm scales the fp32 score), exact value codes times P s rounded to that dtype, "
                  "fp32 accumulation (the sm_90 decode)", lambda: ActMmaReference(table=True),
                  differs_on=("decode", "store_decode"), oracle={"*": DEQUANTIZED_TABLE},
                  terms={"*": (tol.DECODE_ACT_TABLE,)}),
    # torch-sdpa attends over the unquantized cache: bugs in reading the quantized cache or rotating the
    # query have nothing to act on there
    RoundingModel("act-sdpa", "SDPA in the activation dtype over the unquantized cache (torch-sdpa: it never "
                  "reads the quantized cache)", ActSdpaReference, differs_on=("decode",),
                  oracle={"*": UNQUANTIZED}, terms={"*": (tol.DECODE_ACT_SDPA,)},
                  unread=frozenset({"turboquant.norm-correction-twice", "turboquant.query-rotated-by-transpose",
                                    "turboquant.soa-read-as-aos"})),
))
ROUNDING_MODELS = {m.name: m.words for m in MODELS.values()}


def model(name: str) -> RoundingModel:
    """The record of the model called ``name``; a ValueError naming the known ones otherwise."""
    return lookup(MODELS, name)
