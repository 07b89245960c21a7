"""GDN oracles: ``numpy_ref`` in float64, one variant per rounding model.

"exact" -> ``numpy_ref`` in float64 (the chunked op against the *recurrent* form rounded every
chunk_size tokens, so the chunk algebra is checked too); "bf16-operands" and "bf16-gemm" (chunked
only) -> ``numpy_ref.chunked(operand_dtype="bfloat16")`` in float64; on every other op a backend of
those models is held to the exact oracle (its decode kernels compute in fp32).
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell
from conformance.families.gdn.driver import run_with
from conformance.families.gdn.matrix import CHUNK
from conformance.memo import Memo

ROUNDING_MODELS = {
    "exact": "fp32 arithmetic throughout; the state rounded to its dtype at each write-back",
    "bf16-operands": "chunked: GEMM operands rounded to bf16, fp32 accumulation (the C++ chunk kernel); "
                     "other ops as exact",
    "bf16-gemm": "chunked: bf16 GEMM operands and bf16-rounded GEMM results (torch eager); other ops as exact",
}


class Float64Oracle:
    """``numpy_ref`` in float64 with the reference's function names (an impl for ``run_with``).

    chunked runs the recurrent form rounded every ``state_write_interval`` (default chunk_size)
    tokens, unless ``operand_dtype="bfloat16"``: then numpy_ref.chunked with the kernel's bf16 operands.
    """

    def __init__(self, operand_dtype: str = "float32"):
        from reference.gdn import numpy_ref
        self._ref = numpy_ref
        self.operand_dtype = operand_dtype

    def gating(self, *args, **kw):
        return self._ref.gating(*args, **kw, compute_dtype="float64")

    def recurrent(self, *args, **kw):
        return self._ref.recurrent(*args, **kw, compute_dtype="float64")

    def chunked(self, *args, chunk_size=CHUNK, state_write_interval=None, **kw):
        interval = chunk_size if state_write_interval is None else state_write_interval
        if self.operand_dtype == "float32":
            return self._ref.recurrent(*args, **kw, state_write_interval=interval, compute_dtype="float64")
        return self._ref.chunked(*args, **kw, chunk_size=chunk_size, state_write_interval=interval,
                                 operand_dtype=self.operand_dtype, compute_dtype="float64")

    def decode(self, *args, **kw):
        return self._ref.decode(*args, **kw, compute_dtype="float64")

    def spec_decode(self, *args, **kw):
        return self._ref.spec_decode(*args, **kw, compute_dtype="float64")


def oracle_kind(cell: Cell, rounding_model: str) -> str:
    """Which oracle a backend of this rounding model is held to on this cell: "exact" or "bf16-operands"."""
    if rounding_model not in ROUNDING_MODELS:
        raise ValueError(f"rounding_model: expected one of {sorted(ROUNDING_MODELS)}, got {rounding_model!r}")
    if cell.op == "chunked" and rounding_model != "exact":
        return "bf16-operands"
    return "exact"


def oracle_name(cell: Cell, kind: str) -> str:
    """The oracle in words (recorded with every verdict)."""
    if kind == "bf16-operands":
        return "oracle: numpy_ref.chunked in float64 with bf16 operands"
    if cell.op == "chunked":
        return "oracle: numpy_ref.recurrent in float64, state rounded every chunk"
    return f"oracle: numpy_ref.{cell.op} in float64"


def oracle(cell: Cell, inputs: dict, kind: str, memo: Memo, fp32_state: bool = False) -> dict:
    """Oracle outputs of ``kind`` for the cell's inputs, memoised in ``memo``.

    ``fp32_state``: the same run with a float32 state pool (the quality reference of 16-bit states).
    """
    def compute() -> dict:
        x = inputs
        if fp32_state:
            x = {**x, "state": x["state"].astype(np.float32), "state_dtype": "float32"}
        if "state" in x:
            x = {**x, "state": x["state"].copy()}
        return run_with(Float64Oracle("bfloat16" if kind == "bf16-operands" else "float32"), cell, x)

    return memo.get(cell, inputs, ("gdn-oracle", kind, fp32_state), compute)
