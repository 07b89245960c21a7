"""GDN oracles: ``numpy_ref`` in float64, one variant per rounding model.

"exact" -> ``numpy_ref`` in float64 (the chunked op against the *recurrent* form rounded every
chunk_size tokens, so the chunk algebra is checked too); "bf16-operands" and "bf16-gemm" (chunked
only) -> ``numpy_ref.chunked(operand_dtype="bfloat16")`` in float64; on every other op a backend of
those models is held to the exact oracle (its decode kernels compute in fp32). "fla-chunk" (FLA's
chunk kernels) -> ``numpy_ref.chunked(operand_dtype="bfloat16", rounding_points="fla")`` in float64 on
the chunked op, exact on every other op (FLA's recurrent kernel runs on fp32 inputs). "vllm-cpu" (vLLM's CPU
ops) -> the oracle of their conventions: q/k l2 norm epsilon 1e-5; the decode op's beta =
bf16(1 / bf16(1 + bf16(exp(-b)))) (``vllm_decode_beta``); the chunked op's bf16 operands.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell, activation
from conformance.families.gdn.driver import run_with
from conformance.families.gdn.matrix import CHUNK
from conformance.memo import Memo

ROUNDING_MODELS = {
    "exact": "fp32 arithmetic throughout; the state rounded to its dtype at each write-back",
    "bf16-operands": "chunked: GEMM operands rounded to bf16, fp32 accumulation (the C++ chunk kernel); "
                     "other ops as exact",
    "bf16-gemm": "chunked: bf16 GEMM operands and bf16-rounded GEMM results (torch eager); other ops as exact",
    "fla-chunk": "chunked: FLA's chunk kernels (fla-core 0.6.0), rounding to the activation dtype (bf16 or "
                 "fp16): q/k after the l2 norm with the scale on fp32 products, T, W, U, chunk-start state, "
                 "readout v_new and state increment, the output; other ops as exact",
    "vllm-cpu": "vLLM's CPU ops: l2 norm epsilon 1e-5, decode's beta in the activations' 16-bit arithmetic, "
                "chunked with bf16 operands, outputs rounded to the activation dtype, gating's vectorised "
                "softplus log(1 + exp(x))",
}
# The activation dtypes a model is defined for (a model left out: every dtype). FLA's float32 path runs
# TF32 dots (fla/ops/gated_delta_rule/chunk_fwd.py: SOLVE_TRIL_DOT_PRECISION = 'tf32'), not emulated here.
MODEL_ACTIVATIONS = {"fla-chunk": ("bfloat16", "float16")}
VLLM_L2NORM_EPS = 1e-5


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
    (None: sigmoid in float64).
    """

    def __init__(self, operand_dtype: str = "float32", l2norm_eps: float | None = None, decode_beta=None,
                 rounding_points: str = "cpu"):
        from reference.gdn import numpy_ref
        self._ref = numpy_ref
        self.operand_dtype = operand_dtype
        self.rounding_points = rounding_points
        self.l2norm_eps = l2norm_eps
        self.decode_beta = decode_beta

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
                                 compute_dtype="float64")

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
        return self._ref.spec_decode(*args, **self._eps(kw), compute_dtype="float64")


def defined_for(cell: Cell, rounding_model: str) -> bool:
    """Whether ``rounding_model`` is defined for the cell's activation dtype (``MODEL_ACTIVATIONS``)."""
    return activation(cell) in MODEL_ACTIVATIONS.get(rounding_model, (activation(cell),))


def oracle_kind(cell: Cell, rounding_model: str) -> str:
    """Which oracle a backend of this rounding model is held to on this cell."""
    if rounding_model not in ROUNDING_MODELS:
        raise ValueError(f"rounding_model: expected one of {sorted(ROUNDING_MODELS)}, got {rounding_model!r}")
    if cell.op == "chunked" and not defined_for(cell, rounding_model):
        raise ValueError(f"rounding_model: {rounding_model!r} is defined for activations in "
                         f"{MODEL_ACTIVATIONS[rounding_model]}, not {activation(cell)} ({cell.id})")
    if rounding_model == "vllm-cpu":
        return "vllm-cpu-bf16-operands" if cell.op == "chunked" else "vllm-cpu"
    if cell.op == "chunked" and rounding_model == "fla-chunk":
        return "fla-chunk"
    if cell.op == "chunked" and rounding_model != "exact":
        return "bf16-operands"
    return "exact"


def _impl(kind: str, cell: Cell) -> Float64Oracle:
    if kind == "vllm-cpu":
        return Float64Oracle("float32", VLLM_L2NORM_EPS, vllm_decode_beta)
    if kind == "vllm-cpu-bf16-operands":
        return Float64Oracle("bfloat16", VLLM_L2NORM_EPS)
    if kind == "fla-chunk":
        return Float64Oracle(activation(cell), rounding_points="fla")
    return Float64Oracle("bfloat16" if kind == "bf16-operands" else "float32")


def oracle_name(cell: Cell, kind: str) -> str:
    """The oracle in words (recorded with every verdict)."""
    if kind == "vllm-cpu-bf16-operands":
        return "oracle: numpy_ref.chunked in float64 with bf16 operands, l2 norm epsilon 1e-5"
    if kind == "vllm-cpu":
        beta = ", beta rounded as vLLM's decode op" if cell.op == "decode" else ""
        return f"oracle: numpy_ref.{cell.op} in float64, l2 norm epsilon 1e-5{beta}"
    if kind == "bf16-operands":
        return "oracle: numpy_ref.chunked in float64 with bf16 operands"
    if kind == "fla-chunk":
        return (f"oracle: numpy_ref.chunked in float64 with {activation(cell)} operands at FLA's rounding "
                "points")
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
        return run_with(_impl(kind, cell), cell, x)

    return memo.get(cell, inputs, ("gdn-oracle", kind, fp32_state), compute)
