"""GDN tolerances: each one as data (name, bound, rounding argument, the planted bugs it catches),
then the function that evaluates them for a cell.

Symbols: L the longest sequence (decode: its calls), K the key head size, C the chunk (64 for chunked, else 0),
R the state roundings of the longest sequence, u the unit roundoff of the state dtype,
u32 / u_bf16 of float32 / bfloat16 (``conformance.numerics``), u_act of the cell's activation dtype,
max|x| over the oracle's output, T_o / T_S the largest sum of |terms| behind an element of o / of the
state (``terms.magnitudes``).
The o and state tolerances add up the terms that apply to a cell: FP32 always, STATE_16BIT for a
bfloat16/float16 pool (with STATE_CHAIN where its roundings decouple over a chain), OUTPUT_ROUNDING for an o returned in a 16-bit activation dtype (unless the
oracle rounds o itself: FLA_CHUNK), and the terms the backend's rounding model adds on the cell's op
(``models.MODELS``: BF16_OPERANDS, BF16_GEMM, FLA_CHUNK with BF16_OPERANDS at u_act in place of u_bf16,
VLLM_SOLVE, VLLM_GATING).
"""
from __future__ import annotations

import math

import numpy as np

from conformance.cells import Cell, activation
from conformance.compare import Tolerance, ToleranceSpec
from conformance.families.gdn.driver import cuts
from conformance.families.gdn.matrix import CHUNK
from conformance.families.gdn.terms import magnitudes
from conformance.memo import Memo
from conformance.numerics import U32, UBF16, UNDERFLOW, UNIT
from conformance.rounding import RoundingModel

FP32_LAMBDA = 8
FP32 = ToleranceSpec(
    "gdn.fp32", "atol 8 sqrt(L (K + C)) u32 T (o: T_o, state: T_S), rtol 16 K u32",
    "a rounding error is u32 times a partial sum, and no partial sum exceeds the sum of |terms| T "
    "(``terms``: T_o = a |S|^T|q| + beta (|q|.|k|)(|v| + a |S|^T|k|), T_S = a |S| + beta |k| (...)^T, "
    "largest over tokens, heads, elements); independent roundings of one token's K (chunked: K + C) "
    "long sums and of L tokens (the state map is non-expansive) add like a random walk: |err| <= "
    "lambda sqrt(L (K + C)) u32 T with probability >= 1 - 2 exp(-lambda^2 / 2), lambda = 8. Scaled by "
    "max|x| instead, a cancelling sum (o ~ 1e-8, T ~ 0.4) failed every fp32 implementation",
    ("gdn.head-mapping-tiled", "gdn.state-read-transposed", "gdn.chunk-update-skipped",
     "gdn.decode-state-through-bf16", "gdn.qk-norm-in-input-dtype", "gdn.beta-through-bf16",
     "gdn.accepted-clamped", "gdn.softplus-unthresholded", "gdn.slot-index-16bit",
     "gdn.dt-bias-read-as-act"))

STATE_16BIT = ToleranceSpec(
    "gdn.state-16bit", "+ atol 4u max|S| (o: / sqrt(K)); state rel_l2 <= 2u sqrt(sum of the m largest S_i^2) / |S|, "
    "m the flips of n R roundings at probability p = sqrt(K + C) u32 / u exceeded with probability <= 2 exp(-lambda^2 / 2)",
    "fp32 and the fp64 oracle land on different sides of a rounding tie with probability p ~ sqrt(K+C) u32 / u "
    "per element and rounding; a flip moves a stored element by one ulp (<= 2u |S_i|). The n R roundings of the "
    "n compared elements flip m times or more with probability <= exp(-n R p) (e n R p / m)^m (Chernoff), m the "
    "least with that <= 2 exp(-lambda^2 / 2) (lambda of FP32); flips of one element at different roundings have "
    "random signs and add in quadrature, so at worst the m flips fall on the m largest elements. A random-walk "
    "estimate 4u sqrt(R p) instead assumed many flips: a decode of 3 x 31 x 32 elements (n R p = 0.25) exceeds "
    "it with a single flip. A biased rounding (truncation) costs ~u on every element at every rounding",
    ("gdn.truncating-store",))

STATE_CHAIN = ToleranceSpec(
    "gdn.state-chain", "16-bit pool with a flip expected more than 6 roundings before its last (n (R - 6) p >= 1, "
    "STATE_16BIT's n, R, p; 6 = DECOUPLED_WALK): the larger of STATE_16BIT's and: + atol 2 lambda sigma (sigma the largest per-head rms of D, the "
    "oracle's own drift from its float32-state run); rel_l2 <= 2 (1 + lambda sqrt(2 / c)) |D| / |x| (c the "
    "compared value columns), for o and for the state",
    "STATE_16BIT counts tie flips that stay one ulp; once a flip is carried into the next rounding the backend's "
    "and the oracle's 16-bit trajectories round different values and their roundings decouple, so over a long "
    "chain (4096 decode calls, bf16 pool) the difference outgrew it (elementwise margin 1.86). Each trajectory is "
    "the float32-state truth plus its drift: round to nearest at every write, the same law for the backend (fp32 "
    "arithmetic) and the oracle (fp64), whose drift D is measured by running the oracle with a float32 pool. "
    "|backend - oracle| <= |D_backend| + |D_oracle|, whatever the coupling; the update mixes a value column's "
    "elements (S^T k), so an element's drift is taken as sub-Gaussian at its head's rms sigma: <= lambda sigma "
    "each with probability >= 1 - 2 exp(-lambda^2 / 2). |D_backend|^2 sums the squared drifts of c independent "
    "columns, concentrating within a relative lambda sqrt(2 / c) of |D_oracle|^2. Measured on the ci chains "
    "(256 decode calls, 512 recurrent tokens): max |backend - oracle| up to 6.4 sigma, on the full tier's 16384 "
    "decode calls 10.5 sigma of the whole pool's rms (the largest head's is larger)",
    ("gdn.truncating-store",))

BF16_OPERANDS = ToleranceSpec(
    "gdn.bf16-operands", "+ atol 8 u_bf16 max|x|; rel_l2 o <= u_bf16/4, state <= u_bf16/2, x sqrt(chunks) "
    "(fla-chunk: u_act for u_bf16)",
    "a flip of one bf16 operand rounding moves a product by 2 u_bf16 of one term; the state also takes the "
    "16-bit storage flips those differences cause; each chunk makes new flips and the carried state keeps "
    "the old ones (zero decay forgets nothing): a random walk over the chunks. FLA rounds its operands to "
    "the activation dtype, so its flips are u_act's",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"))

BF16_GEMM = ToleranceSpec(
    "gdn.bf16-gemm", "+ atol 32 u_bf16 max|x|; rel_l2 <= 3 u_bf16",
    "bf16 GEMM results round every product sum once more, three in a row on the way to o and to the state "
    "increment (W@S, then v_new, then the readout / k^T v_new). Wider than a truncating store's error",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped"))

FLA_CHUNK = ToleranceSpec(
    "gdn.fla-chunk", "chunked: BF16_OPERANDS (u_act) with o's + atol 10 u_act max|o|, rel_l2 o <= e + sqrt(2 u_act e), "
    "e = t u_act/4 sqrt(chunks); state rel_l2 <= hypot(STATE_16BIT's, t u_act/2 sqrt(chunks)); t = sqrt(2) for "
    "float16 activations, else 1",
    "the oracle rounds where FLA's chunk kernels do, so what differs are flips: before the output, flips of the "
    "bf16 points (T, W, U, h, v_new, q k^T D, the state increment) bound the difference d by BF16_OPERANDS' "
    "e; both sides then round o to bf16, which turns an element's d_i into 0 or one ulp_i <= 2 u_bf16 |o_i|, "
    "a flip with probability |d_i| / ulp_i: E |diff|^2 <= sum |d_i| ulp_i <= 2 u_bf16 |d| |o| (Cauchy-Schwarz), "
    "rel_l2 <= sqrt(2 u_bf16 e), plus e where |d_i| exceeds an ulp; one ulp of max|o| more per element. "
    "The state is not rounded on the way out: BF16_OPERANDS' state bound, whose flips and a 16-bit pool's are "
    "independent and add in quadrature. FLA's solve_tril multiplies at TF32 input precision, u = 2^-11 "
    "(chunk_fwd.py: SOLVE_TRIL_DOT_PRECISION = 'tf32'), which the oracle does not emulate: for bf16 activations "
    "those flips are 8 times smaller than the operands', for float16 ones as large, doubling the flips (t). "
    "Measured on the H200, 2026-12-01: float16 cells reached 1.01-1.46 of the bound without t, 0.87 with it",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"))

GATING = ToleranceSpec(
    "gdn.gating", "rtol 16 u32",
    "fp32 gating: exp, log1p, sigmoid each <= 2 ulp, products <= 1 ulp",
    ("gdn.gates-rounded-to-bf16", "gdn.gating-in-input-dtype"))

UNTOUCHED = ToleranceSpec(
    "gdn.untouched-slots", "bit-identical",
    "pool slots no sequence writes must keep their bytes",
    ("gdn.padding-slot-written",))

OUTPUT_ROUNDING = ToleranceSpec(
    "gdn.output-rounding", "+ atol u_act max|o|; o rel_l2 + u_act",
    "an o returned in a 16-bit activation dtype is rounded to nearest once: <= u_act relative per element, "
    "so <= u_act in rel_l2 (added to a model's rel_l2 bound; where the model has none, as FP32 and STATE_16BIT, "
    "the rounding alone is no bound on the total: an fp32 recurrent kernel over 2048 tokens into a bf16 pool, "
    "o in float16, differed by rel_l2 8.4e-4 > 2^-11 through the pool's rounding-tie flips); float16 "
    "(u = 2^-11) is 8 times tighter than bfloat16 (2^-8)",
    ("gdn.fp16-read-as-bf16", "gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.fp16-readout-overflow"))

VLLM_SOLVE = ToleranceSpec(
    "gdn.vllm-solve", "chunked: BF16_OPERANDS' rel_l2 bounds x sqrt(2)",
    "vLLM's chunk kernel solves (I + L)^-1 row by row, storing each finished row of T in bf16 and reusing it "
    "(solve_tril_kernel in csrc/cpu/sgl-kernels/fla.cpp, v0.32.0), so T reaches W and U through two bf16 "
    "roundings instead of one: twice the independent flips, which add in quadrature. Measured 2026-12-01: "
    "bf16 pools at zero decay reach 1.00-1.12 of the single-rounding bound, under 1.41",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"))

VLLM_GATING = ToleranceSpec(
    "gdn.vllm-gating", "g: rtol 16 u32 + atol 2 u32 max exp(A_log); beta: rtol 3 u_act + 16 u32, atol 3 "
    "underflow_act",
    "vLLM's vectorised softplus is log(1 + exp(x)) without log1p: 1 + exp(x) rounds with absolute error "
    "<= u32, so softplus is off by <= 2 u32 absolute (0 for x < -16.6), g by 2 u32 exp(A_log); its beta "
    "comes in the activation dtype: either 1 / (1 + exp(-b)) in that 16-bit arithmetic (three roundings, "
    "<= u_act relative each, or half the smallest subnormal absolute: underflow_act) or an fp32 sigmoid "
    "stored in it",
    ("gdn.gates-rounded-to-bf16",))

SPECS = (FP32, STATE_16BIT, STATE_CHAIN, BF16_OPERANDS, BF16_GEMM, FLA_CHUNK, OUTPUT_ROUNDING, GATING, UNTOUCHED, VLLM_SOLVE,
         VLLM_GATING)

GATING_TOL = Tolerance(0.0, 16 * U32, f"{GATING.name}: {GATING.argument}: 16 u32 relative")
UNTOUCHED_TOL = Tolerance(0.0, 0.0, f"{UNTOUCHED.name}: {UNTOUCHED.argument}")


def gating(cell: Cell, inputs: dict, model: RoundingModel) -> tuple[Tolerance, Tolerance]:
    """(g tolerance, beta tolerance) of a backend of ``model`` (``VLLM_GATING`` when its terms name it)."""
    if VLLM_GATING not in model.terms_on("gating"):
        return GATING_TOL, GATING_TOL
    atol = 2 * U32 * float(np.max(np.exp(np.asarray(inputs["A_log"], np.float64))))
    return (Tolerance(atol, 16 * U32, f"{VLLM_GATING.name} (g)"),
            Tolerance(3 * UNDERFLOW[activation(cell)], 3 * UNIT[activation(cell)] + 16 * U32,
                      f"{VLLM_GATING.name} (beta)"))


def longest(cell: Cell, inputs: dict) -> int:
    """Tokens of the longest sequence (decode: its calls, ``steps``)."""
    if cell.op == "decode":
        return inputs.get("steps", 1)
    return int(np.max(np.diff(inputs["cu_seqlens"])))


def interval(cell: Cell, inputs: dict) -> int:
    """Tokens between state roundings (decode and spec_decode: every token)."""
    if cell.op == "recurrent":
        return inputs["state_write_interval"]
    return CHUNK if cell.op == "chunked" else 1


def roundings(L: int, every: int, cuts: tuple[int, ...] = ()) -> int:
    """State roundings of an L-token sequence fed in calls that begin at the token offsets ``cuts``
    (``driver.cuts``): every ``every`` tokens of a call and at its end."""
    bounds = [0] + [c for c in cuts if c < L] + [L]
    return sum(math.ceil((b - a) / every) for a, b in zip(bounds, bounds[1:]))


def flips(roundings: int, p: float) -> int:
    """Least m with P(m or more of ``roundings`` ties flip, each with probability p) <= 2 exp(-lambda^2 / 2)
    by the Chernoff bound exp(-mu) (e mu / m)^m, mu = roundings p."""
    mu, log_delta = roundings * p, math.log(2.0) - FP32_LAMBDA ** 2 / 2
    m = max(1, math.ceil(mu))
    while m < roundings and -mu + m * (1.0 + math.log(mu / m)) > log_delta:
        m += 1
    return min(m, roundings)


def state_rel_l2(state: np.ndarray, R: int, p: float, u: float) -> float:
    """``STATE_16BIT``'s rel_l2 bound on the compared ``state`` (the oracle's) after R roundings each."""
    x2 = np.square(np.asarray(state, np.float64)).ravel()
    total = float(np.sum(x2))
    if total == 0.0 or R == 0:                     # nothing to flip, or no rounding
        return 0.0
    m = flips(x2.size * R, p)
    whole, part = divmod(m, R)                     # an element takes up to R of the m flips
    k = min(whole + 1, x2.size)
    top = np.sort(np.partition(x2, x2.size - k)[x2.size - k:])[::-1]
    worst = R * float(np.sum(top[:whole])) + (part * float(top[whole]) if whole < k else 0.0)
    return 2 * u * math.sqrt(worst / total)


# Roundings after a flip whose decoupled walk stays inside STATE_16BIT's 4 u: the difference of two independent
# round-to-nearest walks of M roundings has standard deviation u sqrt(M / 6), within 4 u at 4 sd for M <= 6.
DECOUPLED_WALK = 6


def decoupled(n: int, R: int, p: float) -> bool:
    """``STATE_CHAIN``'s condition: a tie flip expected among the n (R - DECOUPLED_WALK) roundings that leave
    more than DECOUPLED_WALK roundings after it (earlier flips than that stay inside STATE_16BIT)."""
    return n * (R - DECOUPLED_WALK) * p >= 1.0


def drift_bounds(drift: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """``STATE_CHAIN``'s (atol, rel_l2) from the oracle's drift D (its 16-bit run minus its float32-state
    run) and that float32-state run ``truth``, both [rows, HV, ...] (head axis 1)."""
    d = np.asarray(drift, np.float64)
    heads = np.moveaxis(d, 1, 0).reshape(d.shape[1], -1)
    sigma = float(np.max(np.sqrt(np.mean(np.square(heads), axis=1)), initial=0.0))
    columns = d.size // d.shape[-2] if d.ndim == 4 else d.size          # state: [.., K, V]; o: one per element
    norm = float(np.linalg.norm(np.asarray(truth, np.float64).ravel())) or 1.0
    rel = 2 * (1 + FP32_LAMBDA * math.sqrt(2 / max(columns, 1))) * float(np.linalg.norm(d.ravel())) / norm
    return 2 * FP32_LAMBDA * sigma, rel


def _oracle_drift(cell: Cell, inputs: dict, memo: Memo, rows, written) -> dict:
    """name -> (D, float32-state truth) of o (``rows``) and the state (``written``) for ``STATE_CHAIN``."""
    from conformance.families.gdn.oracle import oracle

    own, truth = oracle(cell, inputs, "exact", memo), oracle(cell, inputs, "exact", memo, fp32_state=True)
    pick = {"o": slice(None) if rows is None else rows, "state": slice(None) if written is None else written}
    return {n: (own[n][i].astype(np.float64) - truth[n][i], truth[n][i]) for n, i in pick.items()}


def o_and_state(cell: Cell, inputs: dict, expected: dict, model: RoundingModel, compute: str = "float32",
                written: np.ndarray | None = None, memo: Memo | None = None,
                o_dtype: str = "float32", rows: np.ndarray | None = None) -> tuple[Tolerance, Tolerance]:
    """(o tolerance, state tolerance) of a backend of ``model`` (the terms it adds on the cell's op)
    against its oracle ``expected``;
    ``compute`` the dtype its arithmetic runs in (the FP32 term with that dtype's unit roundoff);
    ``written`` the pool slots the state comparison covers (None: the whole pool); ``memo`` keeps
    the term magnitudes (a float64 replay of the op) across the backends of one cell; ``o_dtype``
    the dtype the backend returned o in (float32, or the 16-bit activation dtype: OUTPUT_ROUNDING); ``rows``
    the rows of o compared (None: all)."""
    sname, chain = inputs["state_dtype"], None
    L, K = longest(cell, inputs), cell["K"]
    C = CHUNK if cell.op == "chunked" else 0
    o_max = float(np.max(np.abs(expected["o"]))) or 1.0
    s_max = float(np.max(np.abs(expected["state"]))) or 1.0
    memo = Memo() if memo is None else memo
    o_terms, s_terms = memo.get(cell, inputs, "gdn-term-magnitudes", lambda: magnitudes(cell, inputs))
    uc = UNIT[compute]
    fp32 = FP32_LAMBDA * math.sqrt(L * (K + C)) * uc
    why = (f"{FP32.name} (L={L}, K+C={K + C}{'' if compute == 'float32' else ', ' + compute}, "
           f"o terms {o_terms:.3g}, state terms {s_terms:.3g})")
    o_atol, s_atol, o_l2, s_l2 = fp32 * o_terms, fp32 * s_terms, None, None
    if sname != "float32":
        u = UNIT[sname]
        R = roundings(L, interval(cell, inputs), cuts(inputs))
        o_atol += 4 * u * s_max / math.sqrt(K)
        s_atol += 4 * u * s_max
        compared = expected["state"] if written is None else expected["state"][written]
        p = math.sqrt(K + C) * U32 / u
        s_l2 = state_rel_l2(compared, R, p, u)
        why += f"; {STATE_16BIT.name} ({sname}, R={R})"
        if decoupled(compared.size, R, p):
            drift = memo.get(cell, inputs, ("gdn-oracle-drift", rows, written),
                             lambda: _oracle_drift(cell, inputs, memo, rows, written))
            chain = [drift_bounds(*drift[n]) for n in ("o", "state")]
            why += f"; {STATE_CHAIN.name} (2 lambda sigma: o {chain[0][0]:.3g}, state {chain[1][0]:.3g})"
    terms = model.terms_on(cell.op)
    fla = FLA_CHUNK in terms
    if BF16_OPERANDS in terms:
        walk = math.sqrt(roundings(L, CHUNK, cuts(inputs)))
        u_op = UNIT[activation(cell)] if fla else UBF16
        o_atol += 8 * u_op * o_max
        s_atol += 8 * u_op * s_max
        if fla:  # FLA_CHUNK: the TF32 solve's flips (t), a 16-bit pool's flips in quadrature
            t = math.sqrt(2) if activation(cell) == "float16" else 1.0
            o_l2, s_l2 = t * walk * u_op / 4, math.hypot(s_l2 or 0.0, t * walk * u_op / 2)
        else:
            o_l2, s_l2 = walk * u_op / 4, max(s_l2 or 0.0, walk * u_op / 2)
        why += f"; {BF16_OPERANDS.name} (sqrt(chunks)={walk:.3g}, u={u_op:g})"
    if VLLM_SOLVE in terms:
        o_l2, s_l2 = o_l2 * math.sqrt(2), max(s_l2, walk * u_op / 2 * math.sqrt(2))
        why += f"; {VLLM_SOLVE.name}"
    if fla:
        o_atol += 2 * u_op * o_max
        o_l2 += math.sqrt(2 * u_op * o_l2)
        why += f"; {FLA_CHUNK.name}"
    elif BF16_GEMM in terms:
        o_atol += 32 * UBF16 * o_max
        s_atol += 32 * UBF16 * s_max
        o_l2, s_l2 = 3 * UBF16, max(s_l2 or 0.0, 3 * UBF16)
        why += f"; {BF16_GEMM.name}"
    if o_dtype != "float32" and not fla:
        u_out = UNIT[o_dtype]
        o_atol += u_out * o_max
        o_l2 = None if o_l2 is None else o_l2 + u_out   # no rel_l2 criterion to widen: the atol term bounds it
        why += f"; {OUTPUT_ROUNDING.name} ({o_dtype})"
    if chain is not None:   # STATE_CHAIN: the larger of it and what the other terms allow
        (o_chain, o_rel), (s_chain, s_rel) = chain
        o_atol, s_atol = max(o_atol, fp32 * o_terms + o_chain), max(s_atol, fp32 * s_terms + s_chain)
        o_l2 = None if o_l2 is None else max(o_l2, o_rel)
        s_l2 = max(s_l2, s_rel)
    return (Tolerance(o_atol, 16 * uc * K, why, rel_l2=o_l2),
            Tolerance(s_atol, 16 * uc * K, why, rel_l2=s_l2))
