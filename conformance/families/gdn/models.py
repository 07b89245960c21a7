"""The GDN rounding models, one record each (``conformance.rounding.RoundingModel``): what a
backend of the model is held to on each op (oracle, tolerance terms), where it differs from exact,
which activation dtypes it is defined for, and the NumPy implementation that computes like it (the
base of its planted-bug runs). ``ROUNDING_MODELS`` and ``oracle_kind`` are derived from them.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell, activation
from conformance.families.gdn import tolerances as tol
from conformance.families.gdn.oracle import ORACLES, SEGMENT_CHUNKS, VLLM_L2NORM_EPS, Float64Oracle, vllm_decode_beta
from conformance.rounding import RoundingModel, by_name, lookup
from reference.gdn import numpy_ref


class Bf16OperandReference:
    """``reference.gdn.numpy_ref`` whose chunked op rounds its GEMM operands to bf16, as the C++
    chunk kernel does: the base implementation of the "bf16-operands" and "bf16-gemm" models."""

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(*args, **kw):
        return numpy_ref.chunked(*args, **kw, operand_dtype="bfloat16")


class SegmentedReference:
    """``reference.gdn.numpy_ref`` whose chunked op rounds its GEMM operands to bf16 and runs the sequences in
    segments of ``SEGMENT_CHUNKS`` chunks merged from their affine maps (``numpy_ref.chunked(segment_chunks)``):
    the base implementation of the "bf16-operands-segmented" model."""

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(*args, **kw):
        return numpy_ref.chunked(*args, **kw, operand_dtype="bfloat16", segment_chunks=SEGMENT_CHUNKS)


class FlaChunkReference:
    """``reference.gdn.numpy_ref`` whose chunked op rounds to q's dtype (bf16 or fp16) where FLA's
    chunk kernels do (``rounding_points="fla"``): the base implementation of the "fla-chunk" model."""

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(q, *args, **kw):
        return numpy_ref.chunked(q, *args, **kw, operand_dtype=np.asarray(q).dtype.name, rounding_points="fla")


class VllmCpuReference:
    """The "vllm-cpu" model's conventions in float64 (l2 norm epsilon 1e-5, the decode op's bf16
    beta, bf16 chunk operands): the base implementation of that model."""

    def __init__(self):
        self._ops = Float64Oracle("float32", VLLM_L2NORM_EPS, vllm_decode_beta)
        self.chunked = Float64Oracle("bfloat16", VLLM_L2NORM_EPS).chunked

    def __getattr__(self, name):
        return getattr(self._ops, name)


class CarriedStateReference:
    """``reference.gdn.numpy_ref`` whose spec_decode carries the state unrounded across a sequence's draft
    tokens, each stored copy rounded once from it (``resume_from_stored=False``): the base implementation
    of the "carried-state" model."""

    def __getattr__(self, name):
        return getattr(numpy_ref, name)

    @staticmethod
    def spec_decode(*args, **kw):
        return numpy_ref.spec_decode(*args, **kw, resume_from_stored=False)


def _numpy_ref():
    return numpy_ref


MODELS = by_name((
    RoundingModel("exact", "fp32 arithmetic throughout; the state rounded to its dtype at each write-back",
                  _numpy_ref, differs_on=None),
    RoundingModel("bf16-operands", "chunked: GEMM operands rounded to bf16, fp32 accumulation (the C++ chunk "
                  "kernel); other ops as exact", Bf16OperandReference, differs_on=("chunked",),
                  oracle={"chunked": ORACLES["bf16-operands"]}, terms={"chunked": (tol.BF16_OPERANDS,)}),
    RoundingModel("bf16-operands-segmented", f"chunked: bf16-operands with each sequence's state pass in segments "
                  f"of {SEGMENT_CHUNKS} chunks, started from states merged from the segments' affine maps (the "
                  "Triton kernels' segment_chunks); other ops as exact", SegmentedReference, differs_on=("chunked",),
                  oracle={"chunked": ORACLES["bf16-operands-segmented"]},
                  terms={"chunked": (tol.BF16_OPERANDS, tol.SEGMENTED)}),
    # torch-eager's bf16 GEMM results carry ~u_bf16 noise, the size of a truncating store's error, of
    # reading fp16 activations as bf16 (a bf16-gemm kernel rounds its operands to bf16 whatever they come in)
    # and of rounding beta to bf16
    RoundingModel("bf16-gemm", "chunked: bf16 GEMM operands and bf16-rounded GEMM results (torch eager); other "
                  "ops as exact", Bf16OperandReference, differs_on=("chunked",),
                  oracle={"chunked": ORACLES["bf16-operands"]}, terms={"chunked": (tol.BF16_GEMM,)},
                  undetectable=frozenset({"gdn.truncating-store", "gdn.fp16-read-as-bf16", "gdn.beta-through-bf16"})),
    # FLA's float32 path runs TF32 dots (fla/ops/gated_delta_rule/chunk_fwd.py: SOLVE_TRIL_DOT_PRECISION =
    # 'tf32'), not emulated here: the model is defined for 16-bit activations only
    RoundingModel("fla-chunk", "chunked: FLA's chunk kernels (fla-core 0.6.0), rounding to the activation dtype "
                  "(bf16 or fp16): q/k after the l2 norm with the scale on fp32 products, T, W, U, chunk-start "
                  "state, readout v_new and state increment, the output; other ops as exact",
                  FlaChunkReference, activations=("bfloat16", "float16"), differs_on=("chunked",),
                  oracle={"chunked": ORACLES["fla-chunk"]}, terms={"chunked": (tol.FLA_CHUNK,)}),
    # vLLM's own softplus is log(1 + exp(x)): VLLM_GATING allows exactly what a softplus without log1p does
    RoundingModel("vllm-cpu", "vLLM's CPU ops: l2 norm epsilon 1e-5, decode's beta in the activations' 16-bit "
                  "arithmetic, chunked with bf16 operands, outputs rounded to the activation dtype, gating's "
                  "vectorised softplus log(1 + exp(x))", VllmCpuReference, differs_on=None,
                  oracle={"chunked": ORACLES["vllm-cpu-bf16-operands"], "*": ORACLES["vllm-cpu"]},
                  terms={"chunked": (tol.BF16_OPERANDS, tol.VLLM_SOLVE), "gating": (tol.VLLM_GATING,)},
                  undetectable=frozenset({"gdn.softplus-without-log1p"})),
    # vLLM's fused gated decode (fused_sigmoid_gating_delta_rule_update) keeps b_h in fp32 registers across
    # a sequence's draft tokens and stores b_h.to(dtype) after each: with a 16-bit pool, one rounding per
    # stored copy, none carried into the next token
    RoundingModel("carried-state", "spec decode: the state carried in fp32 across a sequence's draft tokens, "
                  "each stored copy rounded once from it and never reloaded within the call; other ops as exact",
                  CarriedStateReference, differs_on=("spec_decode",),
                  oracle={"spec_decode": ORACLES["carried-state"]}),
))
ROUNDING_MODELS = {m.name: m.words for m in MODELS.values()}


def model(name: str) -> RoundingModel:
    """The record of the model called ``name``; a ValueError naming the known ones otherwise."""
    return lookup(MODELS, name)


def defined_for(cell: Cell, rounding_model: str) -> bool:
    """Whether ``rounding_model`` is defined for the cell's activation dtype."""
    return model(rounding_model).defined_for(cell)


def oracle_kind(cell: Cell, rounding_model: str) -> str:
    """Which oracle (a name of ``oracle.ORACLES``) a backend of this rounding model is held to on this cell."""
    m = model(rounding_model)
    if cell.op == "chunked" and not m.defined_for(cell):
        raise ValueError(f"rounding_model: {rounding_model!r} is defined for activations in "
                         f"{m.activations}, not {activation(cell)} ({cell.id})")
    return m.oracle_on(cell.op, ORACLES["exact"]).name
