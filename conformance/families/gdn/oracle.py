"""GDN oracles: ``numpy_ref`` in float64, one variant per oracle of ``ORACLES`` (which rounding
model uses which oracle on which op is in ``models``).

"exact" -> ``numpy_ref`` in float64 (the chunked op against the *recurrent* form rounded every
chunk_size tokens, so the chunk algebra is checked too); "bf16-operands" (chunked) ->
``numpy_ref.chunked(operand_dtype="bfloat16")`` in float64; "fla-chunk" (chunked) ->
``numpy_ref.chunked(operand_dtype=<activation>, rounding_points="fla")`` in float64; "vllm-cpu" -> the
oracle of vLLM's CPU conventions: q/k l2 norm epsilon 1e-5 and the decode op's beta =
bf16(1 / bf16(1 + bf16(exp(-b)))) (``vllm_decode_beta``); "vllm-cpu-bf16-operands" -> its chunked op with
bf16 operands; "bf16-operands-segmented" (chunked) -> ``numpy_ref.chunked(operand_dtype="bfloat16",
segment_chunks=SEGMENT_CHUNKS)`` in float64: the segmented state pass; "carried-state" (spec_decode) ->
``numpy_ref.spec_decode(resume_from_stored=False)`` in float64: the state carried unrounded across a sequence's
draft tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from conformance.cells import Cell, activation
from conformance.families.gdn.driver import run_with
from conformance.families.gdn.matrix import CHUNK
from conformance.memo import Memo

VLLM_L2NORM_EPS = 1e-5
SEGMENT_CHUNKS = 2      # the "bf16-operands-segmented" oracle's segments: 2 chunks (ci cells reach 3 and more)


def vllm_decode_beta(b: np.ndarray) -> np.ndarray:
    """float64 beta of vLLM's CPU decode op: ``1 / (1 + std::exp(-b))`` on a bf16 (fp16) ``b`` evaluates in
    c10::BFloat16 (c10::Half) arithmetic, rounding exp(-b), the sum and the quotient to b's dtype."""
    narrow = np.asarray(b).dtype

    def rnd(x):
        return np.asarray(x, np.float64).astype(narrow).astype(np.float64)

    return rnd(1.0 / rnd(1.0 + rnd(np.exp(-np.asarray(b, np.float64)))))


class Float64Oracle:
    """``numpy_ref`` in float64 with the reference's function names (an impl for ``run_with``).

    chunked runs the recurrent form rounded every ``state_write_interval`` (default chunk_size)
    tokens, unless ``operand_dtype="bfloat16"``: then numpy_ref.chunked with the kernel's bf16 operands.
    ``rounding_points`` places those bf16 roundings (numpy_ref.chunked's argument: "cpu" or "fla").
    ``l2norm_eps`` overrides the inputs' epsilon; ``decode_beta`` maps b to beta in the decode op
    (None: sigmoid in float64); ``resume_from_stored`` is spec_decode's (False: the state carried
    across draft tokens unrounded); ``segment_chunks`` numpy_ref.chunked's (None: no segments).
    """

    def __init__(self, operand_dtype: str = "float32", l2norm_eps: float | None = None, decode_beta=None,
                 rounding_points: str = "cpu", resume_from_stored: bool = True, segment_chunks: int | None = None):
        from reference.gdn import numpy_ref
        self._ref = numpy_ref
        self.operand_dtype = operand_dtype
        self.rounding_points = rounding_points
        self.l2norm_eps = l2norm_eps
        self.decode_beta = decode_beta
        self.resume_from_stored = resume_from_stored
        self.segment_chunks = segment_chunks

    def _eps(self, kw: dict) -> dict:
        return kw if self.l2norm_eps is None else {**kw, "l2norm_eps": self.l2norm_eps}

    def gating(self, *args, **kw):
        return self._ref.gating(*args, **kw, compute_dtype="float64")

    def recurrent(self, *args, **kw):
        return self._ref.recurrent(*args, **self._eps(kw), compute_dtype="float64")

    def chunked(self, *args, chunk_size=CHUNK, state_write_interval=None, **kw):
        kw = self._eps(kw)
        interval = chunk_size if state_write_interval is None else state_write_interval
        if self.operand_dtype == "float32":
            return self._ref.recurrent(*args, **kw, state_write_interval=interval, compute_dtype="float64")
        return self._ref.chunked(*args, **kw, chunk_size=chunk_size, state_write_interval=interval,
                                 operand_dtype=self.operand_dtype, rounding_points=self.rounding_points,
                                 compute_dtype="float64", segment_chunks=self.segment_chunks)

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, **kw):
        kw = self._eps(kw)
        if self.decode_beta is None:
            return self._ref.decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, **kw,
                                    compute_dtype="float64")
        g, _ = self._ref.gating(A_log, a, b, dt_bias, compute_dtype="float64")
        cu = np.arange(q.shape[0] + 1, dtype=np.int32)
        return self._ref.recurrent(q, k, v, g, self.decode_beta(b), cu, state, state_indices, **kw,
                                   state_write_interval=1, compute_dtype="float64")

    def spec_decode(self, *args, **kw):
        return self._ref.spec_decode(*args, **self._eps(kw), compute_dtype="float64",
                                     resume_from_stored=self.resume_from_stored)


@dataclass(frozen=True)
class Oracle:
    """One float64 oracle: ``build(cell)`` the implementation ``run_with`` runs, ``words(cell)`` its name
    in words (recorded with every verdict)."""

    name: str
    build: Callable[[Cell], Float64Oracle]
    words: Callable[[Cell], str]


def _exact_words(cell: Cell) -> str:
    if cell.op == "chunked":
        return "oracle: numpy_ref.recurrent in float64, state rounded every chunk"
    return f"oracle: numpy_ref.{cell.op} in float64"


def _vllm_words(cell: Cell) -> str:
    beta = ", beta rounded as vLLM's decode op" if cell.op == "decode" else ""
    return f"oracle: numpy_ref.{cell.op} in float64, l2 norm epsilon 1e-5{beta}"


ORACLES = {o.name: o for o in (
    Oracle("exact", lambda cell: Float64Oracle("float32"), _exact_words),
    Oracle("bf16-operands", lambda cell: Float64Oracle("bfloat16"),
           lambda cell: "oracle: numpy_ref.chunked in float64 with bf16 operands"),
    Oracle("bf16-operands-segmented", lambda cell: Float64Oracle("bfloat16", segment_chunks=SEGMENT_CHUNKS),
           lambda cell: f"oracle: numpy_ref.chunked in float64 with bf16 operands, segments of {SEGMENT_CHUNKS} "
                        "chunks"),
    Oracle("fla-chunk", lambda cell: Float64Oracle(activation(cell), rounding_points="fla"),
           lambda cell: f"oracle: numpy_ref.chunked in float64 with {activation(cell)} operands at FLA's "
                        "rounding points"),
    Oracle("vllm-cpu", lambda cell: Float64Oracle("float32", VLLM_L2NORM_EPS, vllm_decode_beta), _vllm_words),
    Oracle("vllm-cpu-bf16-operands", lambda cell: Float64Oracle("bfloat16", VLLM_L2NORM_EPS),
           lambda cell: "oracle: numpy_ref.chunked in float64 with bf16 operands, l2 norm epsilon 1e-5"),
    Oracle("carried-state", lambda cell: Float64Oracle("float32", resume_from_stored=False),
           lambda cell: "oracle: numpy_ref.spec_decode in float64, the state carried unrounded across a "
                        "sequence's draft tokens"),
)}


def oracle(cell: Cell, inputs: dict, kind: str, memo: Memo, fp32_state: bool = False) -> dict:
    """Oracle outputs of ``kind`` (a name of ``ORACLES``) for the cell's inputs, memoised in ``memo``.

    ``fp32_state``: the same run with a float32 state pool (the quality reference of 16-bit states).
    """
    def compute() -> dict:
        x = inputs
        if fp32_state:
            x = {**x, "state": x["state"].astype(np.float32), "state_dtype": "float32"}
        if "state" in x:
            x = {**x, "state": x["state"].copy()}
        return run_with(ORACLES[kind].build(cell), cell, x)

    return memo.get(cell, inputs, ("gdn-oracle", kind, fp32_state), compute)
