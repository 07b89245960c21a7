"""TurboQuant tolerances: each term as data (name, bound, rounding argument, the planted bugs it
catches) with its formula where it adds to a decode tolerance (``apply``), the prose written from the
same constants; then the functions that evaluate them. A decode tolerance folds DECODE_EXACT, then the
terms the backend's rounding model adds (``models.MODELS``), then OUTPUT_ROUNDING for a 16-bit output;
each verdict's tolerance names the terms it folded (``terms``).

Symbols: D head size, L the longest sequence, u32 (``conformance.numerics``), u_act the unit roundoff
of the cell's activation dtype (``numerics.UNIT[act]``: 2^-8 bfloat16, 2^-11 float16, 2^-24 float32),
lambda = LAMBDA (the probabilistic rounding-error bound of Higham and Mary 2019: a length-n fp32 sum of
products is off by at most lambda sqrt(n) u32 sum|terms| with overwhelming probability).

``DECODE_EXACT``'s weight term 2 e_x is the first order of exp(2 e_x) - 1 <= 2 e_x (1 + 2 e_x) (e_x <= 1/2):
the cells keep e_x below 1e-3 (the largest in ci, 7e-4, is the aligned draw's peaked softmax with logits up to
about 90 in sum |q_rot k|), so the neglected part is below 0.2% of the term. The adversarial draws scale
queries against keys to keep logits of order 1 to 30 for that reason; values near float16's range (dtype-edge)
enter every term through max|V|.
"""
from __future__ import annotations

import numpy as np

from conformance.compare import Tolerance, ToleranceSpec, fold
from conformance.numerics import U32, UNIT
from reference.turboquant import numpy_ref
from reference.turboquant.presets import preset as lookup

LAMBDA = 8               # the probabilistic bound's lambda (Higham and Mary 2019)
CODE_SUM_ULPS = (2, 8)   # STORE_CODES: keys' (2D + 8) u32 sum_i |x_hat_i R_ij|
VALUE_ULPS = 8           # STORE_CODES: values' 8 u32 (t + 1)
FP16_STEPS = 1           # STORE_FP16: fp16 ulps (ordinal distance)
WEIGHT_SHIFT = 2         # DECODE_EXACT: a logit off by e_x moves the softmax weights by 2 e_x relative
ACT_RTOL = 2             # DECODE_ACT_MMA, DECODE_ACT_TABLE, DECODE_ACT_SDPA: rtol 2 u_act (the normaliser and a 16-bit result)
VALUE_SPAN = 2           # DECODE_ACT_TABLE: |V - v_zero| <= 2 max|V|
QUANT_SIGMAS = 3         # QUANT_ERROR: rel_l2 <= 3 sqrt(distortions)

STORE_CODES_SPEC = ToleranceSpec(
    "turboquant.store-codes", "bit-exact, except adjacent-bucket moves of ties",
    "a kernel's rotation GEMM or division rounds differently from the reference's, which can move a value "
    f"across a decision boundary: keys |y - midpoint| <= ({CODE_SUM_ULPS[0]}D + {CODE_SUM_ULPS[1]}) u32 sum_i "
    f"|x_hat_i R_ij|; values |t - (k + 1/2)| <= {VALUE_ULPS} u32 (t + 1), t = (v - vmin) / scale",
    ("turboquant.nibbles-swapped", "turboquant.fp16-read-as-bf16", "turboquant.slot-16bit"))

STORE_FP16_SPEC = ToleranceSpec(
    "turboquant.store-fp16", f"within {FP16_STEPS} fp16 ulp (ordinal distance)",
    "the fp32 norm or scale an fp16 scalar rounds may differ in its last bit, moving the fp16 rounding by "
    "one step",
    ("turboquant.norm-not-corrected", "turboquant.fp16-read-as-bf16"))


class DecodeFigures:
    """What the decode terms read (``attention_atol``'s figures): the fp32 accumulation bound ``atol``,
    max|V|, the largest logit sum max|x| and u_act (``unit``)."""

    def __init__(self, atol: float, vmax: float, xmax: float, unit: float):
        self.atol, self.vmax, self.xmax, self.unit = atol, vmax, xmax, unit


def _decode_exact(f: DecodeFigures, tol: Tolerance) -> Tolerance:
    return tol.term(DECODE_EXACT, f"fp32 attention vs float64 on the same cache: {DECODE_EXACT.bound}",
                    atol=tol.atol + f.atol)


DECODE_EXACT = ToleranceSpec(
    "turboquant.decode-exact", f"atol max|V| ({WEIGHT_SHIFT} e_x + lambda sqrt(L + D) u32), "
    f"e_x = lambda sqrt(2 (D + 1)) u32 scale max sum|q_rot k|, lambda = {LAMBDA}",
    f"each logit is off by e_x (the q rotation, then the dot), which moves the softmax weights by {WEIGHT_SHIFT} "
    "e_x relative; the softmax sums and PV add lambda sqrt(L + D) u32 relative",
    ("turboquant.norm-correction-twice", "turboquant.query-rotated-by-transpose", "turboquant.wrong-kv-head",
     "turboquant.soa-read-as-aos", "turboquant.last-token-skipped", "turboquant.fp16-read-as-bf16",
     "turboquant.softmax-unshifted"),
    _decode_exact)


def _decode_act_mma(f: DecodeFigures, tol: Tolerance) -> Tolerance:
    return tol.term(DECODE_ACT_MMA, f"u_act={f.unit:g}: {DECODE_ACT_MMA.bound}", atol=tol.atol + f.vmax * f.unit,
                    rtol=tol.rtol + ACT_RTOL * f.unit)


DECODE_ACT_MMA = ToleranceSpec(
    "turboquant.decode-act-mma", f"after DECODE_EXACT: + atol u_act max|V|, rtol {ACT_RTOL} u_act",
    "the oracle rounds q_rot, dequantized K and V to the activation dtype as the MMA operands are; the kernel's "
    f"P in that dtype adds u_act max|V|, its normaliser and a 16-bit result {ACT_RTOL} u_act relative (float32 "
    "activations: u_act = u32, fp32 operands)",
    ("turboquant.norm-correction-twice", "turboquant.query-rotated-by-transpose", "turboquant.wrong-kv-head",
     "turboquant.soa-read-as-aos", "turboquant.last-token-skipped", "turboquant.fp16-read-as-bf16"),
    _decode_act_mma)


def _decode_act_table(f: DecodeFigures, tol: Tolerance) -> Tolerance:
    return tol.term(DECODE_ACT_TABLE, f"u_act={f.unit:g}: {DECODE_ACT_TABLE.bound}",
                    atol=tol.atol + VALUE_SPAN * f.vmax * f.unit, rtol=tol.rtol + ACT_RTOL * f.unit)


DECODE_ACT_TABLE = ToleranceSpec(
    "turboquant.decode-act-table", f"after DECODE_EXACT: + atol {VALUE_SPAN} u_act max|V|, rtol {ACT_RTOL} u_act",
    "the oracle rounds q_rot and the centroid table to the activation dtype as the kernel's MMA operands are "
    "(the fp16 norm scales the fp32 score: exact), and keeps the values exact: the kernel rounds P s once to "
    "that dtype and multiplies the exact codes, so token t's term moves by at most u_act p_t |s_t code_t| = "
    f"u_act p_t |V_t - v_zero_t| <= {VALUE_SPAN} u_act p_t max|V| (a stored row holds its minimum at code 0, "
    f"which is v_zero, and its maximum at the top code); its normaliser and a 16-bit result {ACT_RTOL} u_act "
    "relative (float32 activations: u_act = u32)",
    ("turboquant.norm-correction-twice", "turboquant.query-rotated-by-transpose", "turboquant.wrong-kv-head",
     "turboquant.soa-read-as-aos", "turboquant.last-token-skipped", "turboquant.fp16-read-as-bf16"),
    _decode_act_table)


def _decode_act_sdpa(f: DecodeFigures, tol: Tolerance) -> Tolerance:
    return tol.term(DECODE_ACT_SDPA, f"u_act={f.unit:g}: {DECODE_ACT_SDPA.bound}",
                    atol=tol.atol + f.vmax * f.unit * (1 + WEIGHT_SHIFT * f.xmax), rtol=tol.rtol + ACT_RTOL * f.unit)


DECODE_ACT_SDPA = ToleranceSpec(
    "turboquant.decode-act-sdpa", f"after DECODE_EXACT: + atol max|V| u_act (1 + {WEIGHT_SHIFT} max|x|), rtol "
    f"{ACT_RTOL} u_act",
    "float64 attention over the unquantized cache in the activation dtype: logits rounded to it (weights off "
    f"by {WEIGHT_SHIFT} u_act max|x| relative), P rounded to it (u_act max|V|), output and its normaliser "
    f"{ACT_RTOL} u_act relative",
    ("turboquant.wrong-kv-head", "turboquant.last-token-skipped", "turboquant.fp16-read-as-bf16"),
    _decode_act_sdpa)


class OutputFigures:
    """What ``OUTPUT_ROUNDING`` reads: the 16-bit output dtype ``act`` and max|out| of the oracle."""

    def __init__(self, act: str, top: float):
        self.act, self.top = act, top


def _output_rounding(f: OutputFigures, tol: Tolerance) -> Tolerance:
    u = UNIT[f.act]
    return tol.term(OUTPUT_ROUNDING, f"{f.act}: {OUTPUT_ROUNDING.bound}", atol=tol.atol + u * f.top,
                    rel_l2=None if tol.rel_l2 is None else tol.rel_l2 + u)


OUTPUT_ROUNDING = ToleranceSpec(
    "turboquant.output-rounding", "a 16-bit output: + atol u_act max|out|, rel_l2 + u_act; an output dtype other "
    "than float32 or the activation dtype fails",
    "an output rounded once to the activation dtype moves each element by at most u_act |out| (round to "
    "nearest), so its L2 error by at most u_act relative",
    ("turboquant.output-in-bf16",),
    _output_rounding)

QUANT_ERROR = ToleranceSpec(
    "turboquant.quant-error", f"rel_l2 <= {QUANT_SIGMAS} sqrt(key distortion + value distortion) (reported, not "
    "gated)",
    "first-order estimate sqrt(Dk var(score) + Dv) with var(score) = 1 for N(0,1) q and k at scale "
    "1/sqrt(D); key distortion: Lloyd-Max per unit vector (reference.turboquant.lloyd_max), FP8 E4M3 u^2/3; "
    "b-bit uniform values over ~5.2 sigma: (5.2 / (2^b - 1))^2 / 12",
    ())

SPECS = (STORE_CODES_SPEC, STORE_FP16_SPEC, DECODE_EXACT, DECODE_ACT_MMA, DECODE_ACT_TABLE, DECODE_ACT_SDPA,
         OUTPUT_ROUNDING, QUANT_ERROR)

STORE_CODES = Tolerance(0.0, 0.0, f"{STORE_CODES_SPEC.name}: codes {STORE_CODES_SPEC.bound}: "
                        f"{STORE_CODES_SPEC.argument}", terms=(STORE_CODES_SPEC.name,))
# atol is an ordinal distance here: the check compares fp16 bit patterns in value order
STORE_FP16 = Tolerance(float(FP16_STEPS), 0.0, f"{STORE_FP16_SPEC.name}: fp16 scalars {STORE_FP16_SPEC.bound}: "
                       f"{STORE_FP16_SPEC.argument}", terms=(STORE_FP16_SPEC.name,))
NONE = Tolerance(0.0, 0.0, "")

KEY_DISTORTION = {"turboquant_4bit_nc": 0.0095, "turboquant_k3v4_nc": 0.0345,
                  "turboquant_3bit_nc": 0.0345, "turboquant_k8v4": 2.0**-8 / 3}
VALUE_DISTORTION = {4: (5.2 / 15) ** 2 / 12, 3: (5.2 / 7) ** 2 / 12}


def quant_bound(preset: str) -> float:
    """``QUANT_ERROR``: bound on rel_l2(dequantized attention - unquantized attention)."""
    vb = lookup(preset).value_bits
    return QUANT_SIGMAS * float(np.sqrt(KEY_DISTORTION[preset] + VALUE_DISTORTION[vb]))


def tie_margins(inputs: dict, p) -> dict[str, np.ndarray]:
    """``[n, Hk, D]`` per stored (slot >= 0) element: the distance of its quantizer input to the
    nearest decision boundary over its fp32 rounding-error bound (``STORE_CODES``), in float64;
    <= 1 is a tie. FP8 keys have no boundary to tie on (inf)."""
    keep = inputs["slot_mapping"] >= 0
    k = inputs["key"][keep].astype(np.float64)
    v = inputs["value"][keep].astype(np.float64)
    D = k.shape[-1]
    if p.key_fp8:
        key = np.full(k.shape, np.inf)
    else:
        R = np.asarray(inputs["rotation"], np.float64)
        x = k / (np.linalg.norm(k, axis=-1, keepdims=True) + 1e-8)
        y = x @ R
        mids = numpy_ref.midpoints(numpy_ref.centroids(p.key_bits, D)).astype(np.float64)
        dist = np.min(np.abs(y[..., None] - mids), axis=-1)
        key = dist / ((CODE_SUM_ULPS[0] * D + CODE_SUM_ULPS[1]) * U32 * (np.abs(x) @ np.abs(R)))
    top = 2**p.value_bits - 1
    vmin = np.clip(v.min(axis=-1, keepdims=True), -65504, 65504).astype(np.float32).astype(np.float64)
    vmax = np.clip(v.max(axis=-1, keepdims=True), -65504, 65504).astype(np.float32).astype(np.float64)
    scale = np.maximum(np.float32((vmax - vmin) / top), np.float32(1e-8)).astype(np.float64)
    t = (v - vmin) / scale
    value = np.abs(t - (np.floor(t) + 0.5)) / (VALUE_ULPS * U32 * (t + 1))
    return {"key_codes": key, "value_codes": value}


def ties(inputs: dict, p) -> dict[str, np.ndarray]:
    """Masks ``[n, Hk, D]`` of the stored elements whose quantizer input is a tie (``tie_margins`` <= 1)."""
    return {name: margin <= 1.0 for name, margin in tie_margins(inputs, p).items()}


def attention_atol(q_rot, keys, values, G: int, scale: float, L_max: int,
                   unit: float = U32) -> tuple[float, float, float]:
    """``DECODE_EXACT``: (atol, max|V|, max|x|) of attention computed with unit roundoff ``unit``
    (fp32 by default) against float64 (lambda = 8)."""
    lam, D = float(LAMBDA), q_rot.shape[-1]
    xmax = vmax = 0.0
    for b, (k, v) in enumerate(zip(keys, values)):
        k = np.repeat(np.abs(np.asarray(k, np.float64)), G, axis=1)
        xmax = max(xmax, float((scale * np.einsum("hd,thd->ht", np.abs(q_rot[b]), k)).max()))
        vmax = max(vmax, float(np.abs(v).max()))
    ex = lam * np.sqrt(2 * (D + 1)) * unit * xmax
    return vmax * (WEIGHT_SHIFT * ex + lam * np.sqrt(L_max + D) * unit), vmax, xmax


def attention_agreement(q_rot, keys, values, G: int, scale: float, unit: float = U32) -> Tolerance:
    """``DECODE_EXACT`` between two attentions of the same operands, each computed with unit roundoff
    ``unit``: twice the bound of each against float64. q_rot [B, Hq, D]; keys, values per sequence."""
    L_max = max(len(k) for k in keys)
    atol, _, _ = attention_atol(q_rot, keys, values, G, scale, L_max, unit)
    return Tolerance(atol, 0.0, f"{DECODE_EXACT.name} (u={unit:g}): {DECODE_EXACT.bound}",
                     terms=(DECODE_EXACT.name,)).between_two()


def decode_agreement(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None) -> Tolerance:
    """``attention_agreement`` of two fp32 decodes of the same TurboQuant cache (NumPy arguments as
    ``numpy_ref.decode`` takes them)."""
    keys, values = numpy_ref.dequantize(kv_cache, block_table, seq_lens, preset, layout, rotation, rotated=True)
    q_rot = numpy_ref.rotate_query(query, preset, rotation, np.float64)
    scale = 1.0 / np.sqrt(q_rot.shape[-1]) if scale is None else scale
    return attention_agreement(q_rot, keys, values, q_rot.shape[1] // kv_cache.shape[2], scale)


def decode_tolerance(terms: tuple[ToleranceSpec, ...], atol: float, vmax: float, xmax: float,
                     unit: float = U32) -> Tolerance:
    """The decode tolerance of a rounding model that adds ``terms`` (``DECODE_ACT_MMA``, ``DECODE_ACT_TABLE``,
    ``DECODE_ACT_SDPA`` or none) to ``DECODE_EXACT``, folded in that order from ``attention_atol``'s figures; ``unit`` is u_act."""
    return fold((DECODE_EXACT,) + terms, DecodeFigures(atol, vmax, xmax, unit), NONE)


def output_rounding(tol: Tolerance, expected, act: str) -> Tolerance:
    """``OUTPUT_ROUNDING``: ``tol`` widened for an output stored in the 16-bit activation dtype ``act``."""
    top = float(np.max(np.abs(expected))) if np.size(expected) else 0.0
    return OUTPUT_ROUNDING.apply(OutputFigures(act, top), tol)
