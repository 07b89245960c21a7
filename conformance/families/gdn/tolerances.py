"""GDN tolerances: each term as data (name, bound, rounding argument, the planted bugs it catches) with
its formula (``apply``), the prose written from the same constants; then the functions that fold the
terms that apply to a cell into its tolerances.

Symbols: L the longest sequence (decode: its calls), K the key head size, C the chunk (64 for chunked, else 0),
R the state roundings of the longest sequence, u the unit roundoff of the state dtype,
u32 / u_bf16 of float32 / bfloat16 (``conformance.numerics``), u_act of the cell's activation dtype,
max|x| over the oracle's output, T_o / T_S the largest sum of |terms| behind an element of o / of the
state (``terms.magnitudes``).
The o and state tolerances fold, in this order (``o_and_state``): FP32 always, STATE_16BIT and
O_16BIT_POOL for a bfloat16/float16 pool, the terms the backend's rounding model adds on the cell's op in
the order of its record (``models.MODELS``: BF16_OPERANDS, SEGMENTED, BF16_GEMM, FLA_CHUNK, VLLM_SOLVE),
STATE_CHAIN where a 16-bit pool's roundings decouple over a chain (the larger of it and the rest), and last
OUTPUT_ROUNDING for an o returned in a 16-bit activation dtype, judged against the oracle's o rounded to it
(``output_rounded``; not where the oracle rounds o itself: FLA_CHUNK). Gating folds GATING and the model's terms (VLLM_GATING). Each verdict's tolerance names the
terms it folded (``terms``).
"""
from __future__ import annotations

from functools import cached_property
import math

import numpy as np

from conformance.cells import Cell, activation
from conformance.compare import Tolerance, ToleranceSpec, fold
from conformance.families.gdn.driver import cuts
from conformance.families.gdn.flips import bennett, flip_weights, spacing
from conformance.families.gdn.matrix import CHUNK
from conformance.families.gdn.terms import magnitudes
from conformance.memo import Memo
from conformance.numerics import ACTIVATIONS, U32, UBF16, UNDERFLOW, UNIT
from conformance.rounding import RoundingModel

FP32_LAMBDA = 8         # the probabilistic bound's lambda: exceeded with probability <= 2 exp(-lambda^2 / 2)
FP32_RTOL = 16          # rtol FP32_RTOL K u32
STATE_ULPS = 4          # STATE_16BIT: atol STATE_ULPS u max|S|
FLIP_ULP = 2            # a tie flip moves a stored element by one ulp <= FLIP_ULP u |S_i|
DECOUPLED_WALK = 6      # STATE_CHAIN: ``decoupled``
OPERAND_ULPS = 8        # BF16_OPERANDS: atol OPERAND_ULPS u_bf16 max|x|
OPERAND_O_L2 = 4        # BF16_OPERANDS: rel_l2 o <= u_bf16 / OPERAND_O_L2 sqrt(chunks)
OPERAND_S_L2 = 2        # BF16_OPERANDS: rel_l2 state <= u_bf16 / OPERAND_S_L2 sqrt(chunks)
GEMM_ULPS = 32          # BF16_GEMM: atol GEMM_ULPS u_bf16 max|x|
GEMM_L2 = 3             # BF16_GEMM: rel_l2 GEMM_L2 u_bf16
FLA_O_ULPS = 2          # FLA_CHUNK: o's atol OPERAND_ULPS + FLA_O_ULPS u_act max|o|
GATING_ULPS = 16        # GATING: rtol GATING_ULPS u32 (g: + kappa)
SOLVE_ROUNDINGS = 2     # VLLM_SOLVE: T through two bf16 roundings, rel_l2 x sqrt(SOLVE_ROUNDINGS)
SOFTPLUS_ULPS = 2       # VLLM_GATING: g atol SOFTPLUS_ULPS u32 max exp(A_log)
BETA_ROUNDINGS = 3      # VLLM_GATING: beta rtol BETA_ROUNDINGS u_act, atol BETA_ROUNDINGS underflow_act
MERGE_UNIT = 2.0 ** -20  # SEGMENTED: relative error of one merge product (three TF32 products; fp32: 2^-24)


class Figures:
    """What the o and state terms of one cell read: the op's sizes, the oracle's maxima, the term
    magnitudes (a float64 replay of the op, kept in ``memo`` across the backends of a cell), the state
    roundings, and the oracle's drift (``STATE_CHAIN``, computed when a term reads it)."""

    def __init__(self, cell: Cell, inputs: dict, expected: dict, compute: str, written, memo: Memo,
                 o_dtype: str, rows):
        self.cell, self.inputs, self.memo, self.written, self.rows = cell, inputs, memo, written, rows
        self.compute, self.o_dtype, self.act = compute, o_dtype, activation(cell)
        self.state_dtype = inputs["state_dtype"]
        self.L, self.K = longest(cell, inputs), cell["K"]
        self.C = CHUNK if cell.op == "chunked" else 0
        self.o_max = float(np.max(np.abs(expected["o"]))) or 1.0
        self.s_max = float(np.max(np.abs(expected["state"]))) or 1.0
        self.o_terms, self.s_terms = memo.get(cell, inputs, "gdn-term-magnitudes", lambda: magnitudes(cell, inputs))
        self.uc = UNIT[compute]
        self.fp32 = FP32_LAMBDA * math.sqrt(self.L * (self.K + self.C)) * self.uc
        self.compared = expected["state"] if written is None else expected["state"][written]
        o_rows = np.asarray(expected["o"] if rows is None else expected["o"][rows], np.float64)
        self.o_count, self.o_norm = o_rows.size, float(np.linalg.norm(o_rows.ravel())) or 1.0
        self.o_rows = o_rows
        self.chunks = math.sqrt(roundings(self.L, CHUNK, cuts(inputs)))     # sqrt(chunks): the operand flips' walk
        if self.state_dtype != "float32":
            self.u = UNIT[self.state_dtype]
            self.R = roundings(self.L, interval(cell, inputs), cuts(inputs))
            self.p = math.sqrt(self.K + self.C) * U32 / self.u

    @cached_property
    def chain(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """``STATE_CHAIN``'s (atol, rel_l2) of o and of the state (``drift_bounds``)."""
        drift = self.memo.get(self.cell, self.inputs, ("gdn-oracle-drift", self.rows, self.written),
                              lambda: _oracle_drift(self.cell, self.inputs, self.memo, self.rows, self.written))
        return drift_bounds(*drift["o"]), drift_bounds(*drift["state"])


OState = tuple[Tolerance, Tolerance]


def _fp32(f: Figures, acc: OState) -> OState:
    o, s = acc
    note = (f"L={f.L}, K+C={f.K + f.C}{'' if f.compute == 'float32' else ', ' + f.compute}, "
            f"o terms {f.o_terms:.3g}, state terms {f.s_terms:.3g}")
    rtol = FP32_RTOL * f.uc * f.K
    return (o.term(FP32, note, atol=o.atol + f.fp32 * f.o_terms, rtol=rtol),
            s.term(FP32, note, atol=s.atol + f.fp32 * f.s_terms, rtol=rtol))


FP32 = ToleranceSpec(
    "gdn.fp32", f"atol {FP32_LAMBDA} sqrt(L (K + C)) u32 T (o: T_o, state: T_S), rtol {FP32_RTOL} K u32",
    "a rounding error is u32 times a partial sum, and no partial sum exceeds the sum of |terms| T "
    "(``terms``: T_o = a |S|^T|q| + beta (|q|.|k|)(|v| + a |S|^T|k|), T_S = a |S| + beta |k| (...)^T, "
    "largest over tokens, heads, elements); independent roundings of one token's K (chunked: K + C) "
    "long sums and of L tokens (the state map is non-expansive) add like a random walk: |err| <= "
    "lambda sqrt(L (K + C)) u32 T with probability >= 1 - 2 exp(-lambda^2 / 2), "
    f"lambda = {FP32_LAMBDA}. Scaled by "
    "max|x| instead, a cancelling sum (o ~ 1e-8, T ~ 0.4) failed every fp32 implementation",
    ("gdn.head-mapping-tiled", "gdn.state-read-transposed", "gdn.chunk-update-skipped",
     "gdn.decode-state-through-bf16", "gdn.qk-norm-in-input-dtype", "gdn.beta-through-bf16",
     "gdn.accepted-clamped", "gdn.softplus-unthresholded", "gdn.slot-index-16bit",
     "gdn.dt-bias-read-as-act"),
    _fp32)


def _state_16bit(f: Figures, acc: OState) -> OState:
    o, s = acc
    note = f"{f.state_dtype}, R={f.R}"
    return (o.term(STATE_16BIT, note, atol=o.atol + STATE_ULPS * f.u * f.s_max / math.sqrt(f.K)),
            s.term(STATE_16BIT, note, atol=s.atol + STATE_ULPS * f.u * f.s_max,
                   rel_l2=state_rel_l2(f.compared, f.R, f.p, f.u)))


STATE_16BIT = ToleranceSpec(
    "gdn.state-16bit", f"+ atol {STATE_ULPS}u max|S| (o: / sqrt(K)); state rel_l2 <= {FLIP_ULP}u sqrt(sum of the m "
    "largest S_i^2) / |S|, m the flips of n R roundings at probability p = sqrt(K + C) u32 / u exceeded with "
    "probability <= 2 exp(-lambda^2 / 2)",
    "fp32 and the fp64 oracle land on different sides of a rounding tie with probability p ~ sqrt(K+C) u32 / u "
    f"per element and rounding; a flip moves a stored element by one ulp (<= {FLIP_ULP}u |S_i|). The n R roundings "
    "of the n compared elements flip m times or more with probability <= exp(-n R p) (e n R p / m)^m (Chernoff), "
    "m the least with that <= 2 exp(-lambda^2 / 2) (lambda of FP32); flips of one element at different roundings "
    "have random signs and add in quadrature, so at worst the m flips fall on the m largest elements. A random-walk "
    f"estimate {STATE_ULPS}u sqrt(R p) instead assumed many flips: a decode of 3 x 31 x 32 elements (n R p = 0.25) "
    "exceeds it with a single flip. A biased rounding (truncation) costs ~u on every element at every rounding",
    ("gdn.truncating-store",),
    _state_16bit)


def _o_16bit_pool(f: Figures, acc: OState) -> OState:
    o, s = acc
    n = f.o_count
    walk = math.sqrt(n + FP32_LAMBDA * math.sqrt(2 * n) + FP32_LAMBDA ** 2)
    fp32 = math.sqrt(f.L * (f.K + f.C)) * f.uc * f.o_terms * walk
    flips = math.sqrt(f.memo.get(f.cell, f.inputs, "gdn-flip-weights", lambda: flip_weights(f.cell, f.inputs))
                      .tail(FP32_LAMBDA))
    bound = (fp32 + flips) / f.o_norm
    note = f"fp32 {fp32 / f.o_norm:.3g}, flips {flips / f.o_norm:.3g}"
    return o.term(O_16BIT_POOL, note, rel_l2=bound), s


O_16BIT_POOL = ToleranceSpec(
    "gdn.o-16bit-pool", "16-bit pool: o rel_l2 <= (sigma sqrt(n + lambda sqrt(2n) + lambda^2) + F) / |o|, "
    "sigma = sqrt(L (K + C)) u32 T_o (FP32's atol / lambda), n the compared elements of o; F^2 the Chernoff bound "
    "at lambda on the sum of the flips' weights w = ulp^2 G_t[k, k] over the state's rounding events a later "
    "token reads, each element flipping with probability p = min(1/4, (sigma_kv + X_kv) / ulp) (``flips``); a model's own "
    "o rel_l2 term replaces it",
    "a kernel that reads o from the fp32 state it computed differs from the oracle by (1) its fp32 arithmetic: "
    "each element of o a random walk of standard deviation sigma (FP32's argument, whose elementwise atol is "
    "lambda sigma), so |err|^2 over n elements is at most sigma^2 (n + lambda sqrt(2n) + lambda^2) with "
    "probability >= 1 - exp(-lambda^2 / 2) (Laurent-Massart for a sum of n squares); and (2) the tie flips of "
    "the state it reads back after each rounding event, counted per event and element (``flips``): at an event "
    "after token t the kernel's pre-rounding S_kv is off by its fp32 walk (sigma_kv = sqrt(n (K + C)) u32 T_kv, n "
    "the tokens since the last event, T_kv the element's sum of |terms|, plus u32 |S_kv| for the oracle's step to "
    "float32) and by the part of earlier flips the token maps moved off the 16-bit grid; rounding both to nearest "
    "leaves a noise of E r^2 <= min(E|off-grid difference| / ulp, 1/4) ulp^2 =: p ulp^2, which moves every later "
    "o of its value column by q_t'^T P e_k r (P the product of the token maps exp(g) (I - beta k k^T) in "
    "between, computed in float64 from the op's own gates, so decay, growth without the l2 norm and the end of "
    "the sequence are exact): a flip of weight w = ulp_kv^2 G_t[k, k], G_t = sum_t' P^T q_t' q_t'^T P, with "
    "probability p. Flips of independent signs add their w; P(sum of the w of the flips >= x) <= exp(-theta x + "
    "sum p (exp(theta w) - 1)) (Chernoff, theta the best of a grid), x at probability exp(-lambda^2 / 2). The last "
    "rounding of a sequence is read by no token (one event: no flip term). Following the carried differences "
    "through later roundings covers the chains whose trajectories decouple (STATE_CHAIN leaves o's rel_l2 to "
    "this term). Reading o from the stored 16-bit state instead rounds every element of the state behind each "
    "written-back token's o: an error of about u / sqrt(6) relative on every such element. Measured 2026-12-06 "
    "on the ci cells with a rounding read later, o rel_l2 bound / numpy-ref / stored-state read: spec decode "
    "6.7e-5..5.6e-4 / 1e-7..2.3e-5 / 2e-4..1.7e-3 (every such cell caught); recurrent of 64 to 129 bf16 "
    "roundings 9e-4 / 1e-6 / 1.7e-3; decode chains of 4 (fp16) and 16 (bf16) calls 1.3e-4 / 1.3e-7 / 2e-4 and "
    "1.4e-3 / 2.3e-5 / 1.6e-3. The blanket flip term it replaces (STATE_16BIT's m flips all on the largest "
    "elements, each read at full |q| by every later token) allowed 1e-3 to 0.15, and STATE_CHAIN's drift bound "
    "0.02 on a 256-call chain. Near-one decay over 256 calls and more keeps a bound above the stored-state "
    "read's error (numpy-ref 1.2e-3, the read 2e-3 on a bf16 pool: the trajectories do decouple)",
    ("gdn.o-from-stored-state",),
    _o_16bit_pool)


def _state_chain(f: Figures, acc: OState) -> OState:
    o, s = acc
    (o_chain, o_rel), (s_chain, s_rel) = f.chain
    note = f"2 lambda sigma: o {o_chain:.3g}, state {s_chain:.3g}"
    carried = o.terms[-1:] == (O_16BIT_POOL.name,)         # its flips re-round carried differences
    return (o.term(STATE_CHAIN, note, atol=max(o.atol, f.fp32 * f.o_terms + o_chain),
                   rel_l2=o.rel_l2 if o.rel_l2 is None or carried else max(o.rel_l2, o_rel)),
            s.term(STATE_CHAIN, note, atol=max(s.atol, f.fp32 * f.s_terms + s_chain), rel_l2=max(s.rel_l2, s_rel)))


STATE_CHAIN = ToleranceSpec(
    "gdn.state-chain", "16-bit pool with a flip expected more than "
    f"{DECOUPLED_WALK} roundings before its last (n (R - {DECOUPLED_WALK}) p >= 1, STATE_16BIT's n, R, p; "
    f"{DECOUPLED_WALK} = DECOUPLED_WALK): the larger of what the other terms allow and FP32's atol + 2 lambda "
    "sigma (sigma the largest per-head rms of D, the oracle's own drift from its float32-state run); rel_l2 <= "
    "2 (1 + lambda sqrt(2 / c)) |D| / |x| (c the compared value columns), for the state, and for o unless "
    "O_16BIT_POOL set its rel_l2 last (its flips follow carried differences through later roundings)",
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
    ("gdn.truncating-store",),
    _state_chain)


def _bf16_operands(f: Figures, acc: OState) -> OState:
    o, s = acc
    note = f"sqrt(chunks)={f.chunks:.3g}, u={UBF16:g}"
    return (o.term(BF16_OPERANDS, note, atol=o.atol + OPERAND_ULPS * UBF16 * f.o_max,
                   rel_l2=f.chunks * UBF16 / OPERAND_O_L2),
            s.term(BF16_OPERANDS, note, atol=s.atol + OPERAND_ULPS * UBF16 * f.s_max,
                   rel_l2=max(s.rel_l2 or 0.0, f.chunks * UBF16 / OPERAND_S_L2)))


BF16_OPERANDS = ToleranceSpec(
    "gdn.bf16-operands", f"+ atol {OPERAND_ULPS} u_bf16 max|x|; rel_l2 o <= u_bf16/{OPERAND_O_L2}, state <= "
    f"u_bf16/{OPERAND_S_L2}, x sqrt(chunks)",
    "a flip of one bf16 operand rounding moves a product by 2 u_bf16 of one term; the state also takes the "
    "16-bit storage flips those differences cause; each chunk makes new flips and the carried state keeps "
    "the old ones (zero decay forgets nothing): a random walk over the chunks",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"),
    _bf16_operands)


def _segmented(f: Figures, acc: OState) -> OState:
    from conformance.families.gdn.oracle import SEGMENT_CHUNKS

    o, s = acc
    calls = 1 + sum(1 for c in cuts(f.inputs) if c < f.L)
    merges = roundings(f.L, CHUNK * SEGMENT_CHUNKS, cuts(f.inputs)) - calls
    e = math.sqrt(merges) * f.K * MERGE_UNIT
    note = f"merges={merges}"
    return o.term(SEGMENTED, note, rel_l2=(o.rel_l2 or 0.0) + e), s.term(SEGMENTED, note, rel_l2=(s.rel_l2 or 0.0) + e)


SEGMENTED = ToleranceSpec(
    "gdn.bf16-operands-segmented", f"after BF16_OPERANDS: rel_l2 o and state + sqrt(merges) K {MERGE_UNIT:g}, merges "
    "the segment boundaries of the longest sequence's calls",
    "the segmented state pass (segment i > 0 starts from S_i = A_{i-1} S_{i-1} + B_{i-1}, [A | B] the affine map "
    "of a segment's chunks) drops the bf16 rounding of the carried state inside earlier segments and a 16-bit "
    "pool's roundings there; its oracle makes the same choice (numpy_ref.chunked(segment_chunks)): the maps "
    "round [A | B] where the state pass rounds S (the chunk form on [A | B] from [I | 0] with values [0 | v]), "
    "the merge is exact, a start state is stored to the pool dtype where a write-back falls on it. Kernel and "
    "oracle then differ by BF16_OPERANDS' flips (each chunk's flips reach a compared state once: through its "
    "segment's map or through the state pass, never both) and by the merge's products S' = A s + b: K-term "
    "dots, fp32 (NVIDIA: three TF32 products, u_m <= 2^-20 a product) against float64, off by <= gamma_K "
    "|A| |s| elementwise; the K roundings of a sum walk as sqrt(K) u_m, and the l2 norm of |A| is <= sqrt(K) "
    "times A's, which is <= 1 (a map is a product of the chunks' contractions exp(g)(I - beta k k^T)): a column "
    "off by about K u_m |s|, relative to S' where s and b do not cancel (as for the flips). Merges make "
    "independent errors that later maps do not amplify: a random walk of sqrt(merges) K u_m: 2% of the state "
    "flips' bound at K = 128 and 16 segments of 8 chunks; a sequence of one segment adds nothing",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"),
    _segmented)


def _bf16_gemm(f: Figures, acc: OState) -> OState:
    o, s = acc
    return (o.term(BF16_GEMM, atol=o.atol + GEMM_ULPS * UBF16 * f.o_max, rel_l2=GEMM_L2 * UBF16),
            s.term(BF16_GEMM, atol=s.atol + GEMM_ULPS * UBF16 * f.s_max,
                   rel_l2=max(s.rel_l2 or 0.0, GEMM_L2 * UBF16)))


BF16_GEMM = ToleranceSpec(
    "gdn.bf16-gemm", f"+ atol {GEMM_ULPS} u_bf16 max|x|; rel_l2 <= {GEMM_L2} u_bf16 (a model of its own: "
    "not added to BF16_OPERANDS)",
    "bf16 GEMM results round every product sum once more, three in a row on the way to o and to the state "
    "increment (W@S, then v_new, then the readout / k^T v_new). Wider than a truncating store's error",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped"),
    _bf16_gemm)


def _fla_chunk(f: Figures, acc: OState) -> OState:
    o, s = acc
    u = UNIT[f.act]
    e = f.chunks * u / OPERAND_O_L2
    note = f"sqrt(chunks)={f.chunks:.3g}, u={u:g}"
    o_atol = o.atol + OPERAND_ULPS * u * f.o_max
    return (o.term(FLA_CHUNK, note, atol=o_atol + FLA_O_ULPS * u * f.o_max, rel_l2=e + math.sqrt(2 * u * e)),
            s.term(FLA_CHUNK, note, atol=s.atol + OPERAND_ULPS * u * f.s_max,
                   rel_l2=math.hypot(s.rel_l2 or 0.0, f.chunks * u / OPERAND_S_L2)))


FLA_CHUNK = ToleranceSpec(
    "gdn.fla-chunk", f"chunked: BF16_OPERANDS' terms at u_act (+ atol {OPERAND_ULPS} u_act max|x|) with o's + atol "
    f"{FLA_O_ULPS} u_act max|o| more, rel_l2 o <= e + sqrt(2 u_act e), e = u_act/{OPERAND_O_L2} sqrt(chunks); "
    f"state rel_l2 <= hypot(STATE_16BIT's, u_act/{OPERAND_S_L2} sqrt(chunks)); o is not widened by "
    "OUTPUT_ROUNDING (the oracle rounds it)",
    "the oracle rounds where FLA's chunk kernels do, so what differs are flips: before the output, flips of the "
    "operand points (T, W, U, h, v_new, q k^T D, the state increment) bound the difference d by BF16_OPERANDS' "
    "e with FLA's operand dtype (the activation dtype) for bf16; both sides then round o to that dtype, which "
    "turns an element's d_i into 0 or one ulp_i <= 2 u_act |o_i|, "
    "a flip with probability |d_i| / ulp_i: E |diff|^2 <= sum |d_i| ulp_i <= 2 u_act |d| |o| (Cauchy-Schwarz), "
    "rel_l2 <= sqrt(2 u_act e), plus e where |d_i| exceeds an ulp; one ulp of max|o| more per element. "
    "The state is not rounded on the way out: BF16_OPERANDS' state bound, whose flips and a 16-bit pool's are "
    "independent and add in quadrature. The oracle's T is FLA's too: 16-row diagonal blocks merged by products "
    "whose operands are truncated to TF32 (chunk_fwd.py: SOLVE_TRIL_DOT_PRECISION = 'tf32'); unemulated, that "
    "truncation (2^-10 relative) passes through T's store as flips of sqrt(2 u_act e_T) relative, as large as "
    "the operand flips for bf16: the H100 records of 2026-12-06 of the zero-decay bf16 cells equal their "
    "distance from the untruncated oracle to 3 digits, o and state",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"),
    _fla_chunk)


def _output_rounding(f: Figures, acc: OState) -> OState:
    o, s = acc
    ulp = spacing(rounded_once(f.o_rows, f.o_dtype), ACTIVATIONS[f.o_dtype]).ravel()
    atol = o.atol + float(np.max(ulp, initial=0.0))
    if o.rel_l2 is None:                 # no rel_l2 criterion to carry over: the atol term bounds it
        return o.term(OUTPUT_ROUNDING, f.o_dtype, atol=atol), s
    d = o.rel_l2 * f.o_norm
    mean = d * float(np.linalg.norm(ulp))
    flips = math.sqrt(bennett(mean, float(np.max(ulp)) ** 2, FP32_LAMBDA))
    note = f"{f.o_dtype}, flips {flips / f.o_norm:.3g}"
    return o.term(OUTPUT_ROUNDING, note, atol=atol, rel_l2=o.rel_l2 + flips / f.o_norm), s


OUTPUT_ROUNDING = ToleranceSpec(
    "gdn.output-rounding", "an o returned in a 16-bit activation dtype, against the oracle's o rounded once to that "
    "dtype (after every other term): + atol max ulp; o rel_l2 e + sqrt(x) / |o|, e the rel_l2 of the terms before, "
    "x Bennett's bound at lambda on a sum of terms in [0, b] of mean <= e |o| |ulp| (b = max ulp^2, |ulp| over "
    "the oracle's rounded o)",
    "kernel and oracle both round o to nearest once: with d_i the difference before the rounding (|d| <= e |o| "
    "by the terms before), the rounded values differ by d_i + r_i, r_i in {-f ulp_i, (1 - f) ulp_i} (d_i = (m + "
    "f) ulp_i): |r_i| <= ulp_i, elementwise + max ulp, and E r_i^2 = f (1 - f) ulp_i^2 <= |d_i| ulp_i, so sum "
    "E r_i^2 <= |d| |ulp| (Cauchy-Schwarz). The r_i^2 are independent and in [0, b]: P(sum r_i^2 >= x) <= "
    "exp(-theta x + (exp(theta b) - 1) mean / b) (convexity on [0, b]), x at exp(-lambda^2 / 2); |diff| <= |d| + "
    "sqrt(x). A rel_l2 of e + u_act (against the unrounded oracle) let a kernel whose o was read from the "
    "stored 16-bit state pass; against the rounded oracle the flips cost only what the pre-rounding difference "
    "causes. Where the terms before set no rel_l2 (FP32 alone), the rounding alone is no bound on the total: an "
    "fp32 recurrent kernel over 2048 tokens into a bf16 pool, o in float16, differed by rel_l2 8.4e-4 > 2^-11 "
    "through the pool's rounding-tie flips",
    ("gdn.fp16-read-as-bf16", "gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.fp16-readout-overflow",
     "gdn.o-from-stored-state"),
    _output_rounding)


def _vllm_solve(f: Figures, acc: OState) -> OState:
    o, s = acc
    return (o.term(VLLM_SOLVE, rel_l2=o.rel_l2 * math.sqrt(SOLVE_ROUNDINGS)),
            s.term(VLLM_SOLVE, rel_l2=max(s.rel_l2, f.chunks * UBF16 / OPERAND_S_L2 * math.sqrt(SOLVE_ROUNDINGS))))


VLLM_SOLVE = ToleranceSpec(
    "gdn.vllm-solve", f"chunked: BF16_OPERANDS' rel_l2 bounds x sqrt({SOLVE_ROUNDINGS}) (after BF16_OPERANDS)",
    "vLLM's chunk kernel solves (I + L)^-1 row by row, storing each finished row of T in bf16 and reusing it "
    "(solve_tril_kernel in csrc/cpu/sgl-kernels/fla.cpp, v0.32.0), so T reaches W and U through two bf16 "
    "roundings instead of one: twice the independent flips, which add in quadrature. Measured 2026-12-01: "
    "bf16 pools at zero decay reach 1.00-1.12 of the single-rounding bound, under 1.41",
    ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"),
    _vllm_solve)


GatingTols = tuple[Tolerance, Tolerance]


class GatingFigures:
    """What the gating terms of one cell read: its inputs (A_log, a, b, dt_bias) and activation dtype."""

    def __init__(self, cell: Cell, inputs: dict):
        self.inputs, self.act = inputs, activation(cell)

    @cached_property
    def kappa(self) -> float:
        """``GATING``'s kappa: the largest condition number of softplus (``softplus_condition``) over the
        elements whose float32 sum x = a + dt_bias is inexact (0 where every sum is exact)."""
        a, dt_bias = self.inputs["a"], self.inputs["dt_bias"]
        x = np.asarray(a, np.float64) + np.asarray(dt_bias, np.float64)
        inexact = (np.asarray(a, np.float32) + np.asarray(dt_bias, np.float32)).astype(np.float64) != x
        return float(np.max(softplus_condition(x[inexact]), initial=0.0))


def softplus_condition(x: np.ndarray) -> np.ndarray:
    """A bound on the relative condition number of softplus (threshold 20) at ``x``, kappa(x) = |x
    softplus'(x) / softplus(x)| = |x| sigmoid(x) / softplus(x): max(1, -x). softplus(x) >= sigmoid(x)
    (log(1 + y) >= y / (1 + y)) gives kappa <= |x| for x < 0, tight as x -> -inf; softplus(x) = x +
    log(1 + exp(-x)) >= x gives kappa <= 1 for x >= 0, and above the threshold softplus(x) = x."""
    return np.maximum(1.0, -np.asarray(x, np.float64))


def _gating(f: GatingFigures, acc: GatingTols) -> GatingTols:
    g, beta = acc
    return (g.term(GATING, f"g, kappa {f.kappa:.3g}", rtol=g.rtol + (GATING_ULPS + f.kappa) * U32),
            beta.term(GATING, "beta", rtol=beta.rtol + GATING_ULPS * U32))


GATING = ToleranceSpec(
    "gdn.gating", f"g: rtol ({GATING_ULPS} + kappa) u32, kappa the largest condition number of softplus at "
    "x = a + dt_bias where the float32 sum rounds (``softplus_condition``); beta: rtol "
    f"{GATING_ULPS} u32",
    "fp32 gating evaluates g = -exp(A_log) softplus(x), x = a + dt_bias, and beta = 1 / (1 + exp(-b)) from "
    "inputs the float64 oracle reads exactly. The functions' own roundings: exp, log1p, the sigmoid's "
    f"quotient each <= 2 ulp (4 u32), products <= 1 ulp: <= {GATING_ULPS} u32 relative on g and on beta (the "
    "sigmoid's condition number in b is |b| sigmoid(-b), but b is read exactly, and the error of exp(-b) "
    "reaches beta damped by exp(-b) / (1 + exp(-b)) <= 1). One rounding comes before a function: the float32 "
    "sum x carries a relative error <= u32, which softplus amplifies by its condition number kappa(x) = "
    "|x sigmoid(x) / softplus(x)| <= max(1, -x): -> |x| as x -> -inf, where softplus(x) ~ exp(x) turns "
    "x's absolute error |x| u32 into a relative one (the product with exp(A_log) keeps relative errors). "
    "A sum exact in float32 (16-bit a and dt_bias almost always give one) carries none. Measured "
    "2026-12-06 without kappa: the full tier's float32 cells (x down to -35) reached 1.12 of 16 u32 on "
    "numpy-ref and 1.10 on jax-ref",
    ("gdn.gates-rounded-to-bf16", "gdn.gating-in-input-dtype", "gdn.softplus-without-log1p"),
    _gating)


def _vllm_gating(f: GatingFigures, acc: GatingTols) -> GatingTols:
    g, beta = acc
    e_max = float(np.max(np.exp(np.asarray(f.inputs["A_log"], np.float64))))
    return (g.term(VLLM_GATING, "g", atol=g.atol + SOFTPLUS_ULPS * U32 * e_max),
            beta.term(VLLM_GATING, "beta", atol=beta.atol + BETA_ROUNDINGS * UNDERFLOW[f.act],
                      rtol=beta.rtol + BETA_ROUNDINGS * UNIT[f.act]))


VLLM_GATING = ToleranceSpec(
    "gdn.vllm-gating", f"after GATING: g + atol {SOFTPLUS_ULPS} u32 max exp(A_log); beta + rtol {BETA_ROUNDINGS} "
    f"u_act, atol {BETA_ROUNDINGS} underflow_act",
    "vLLM's vectorised softplus is log(1 + exp(x)) without log1p: 1 + exp(x) rounds with absolute error "
    f"<= u32, so softplus is off by <= {SOFTPLUS_ULPS} u32 absolute (0 for x < -16.6), g by {SOFTPLUS_ULPS} u32 "
    "exp(A_log); its beta comes in the activation dtype: either 1 / (1 + exp(-b)) in that 16-bit arithmetic "
    f"({BETA_ROUNDINGS} roundings, <= u_act relative each, or half the smallest subnormal absolute: underflow_act) "
    "or an fp32 sigmoid stored in it",
    ("gdn.gates-rounded-to-bf16",),
    _vllm_gating)

UNTOUCHED = ToleranceSpec(
    "gdn.untouched-slots", "bit-identical",
    "pool slots no sequence writes must keep their bytes",
    ("gdn.padding-slot-written",))

SPECS = (FP32, STATE_16BIT, O_16BIT_POOL, STATE_CHAIN, BF16_OPERANDS, SEGMENTED, BF16_GEMM, FLA_CHUNK, OUTPUT_ROUNDING,
         GATING, UNTOUCHED, VLLM_SOLVE, VLLM_GATING)

UNTOUCHED_TOL = Tolerance(0.0, 0.0, f"{UNTOUCHED.name}: {UNTOUCHED.argument}", terms=(UNTOUCHED.name,))
NONE = Tolerance(0.0, 0.0, "")


def gating(cell: Cell, inputs: dict, model: RoundingModel) -> GatingTols:
    """(g tolerance, beta tolerance) of a backend of ``model``: GATING, then the terms the model adds."""
    return fold((GATING,) + model.terms_on("gating"), GatingFigures(cell, inputs), (NONE, NONE))


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
    return FLIP_ULP * u * math.sqrt(worst / total)


def decoupled(n: int, R: int, p: float) -> bool:
    """``STATE_CHAIN``'s condition: a tie flip expected among the n (R - DECOUPLED_WALK) roundings that leave
    more than DECOUPLED_WALK roundings after it (earlier flips than that stay inside STATE_16BIT: the
    difference of two independent round-to-nearest walks of M roundings has standard deviation u sqrt(M / 6),
    within STATE_ULPS u at 4 sd for M <= 6)."""
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
                o_dtype: str = "float32", rows: np.ndarray | None = None) -> OState:
    """(o tolerance, state tolerance) of a backend of ``model`` against its oracle ``expected``: the
    terms that apply to the cell folded in the module's order (FP32, STATE_16BIT and O_16BIT_POOL, the
    model's terms on the cell's op, STATE_CHAIN, OUTPUT_ROUNDING);
    ``compute`` the dtype its arithmetic runs in (the FP32 term with that dtype's unit roundoff);
    ``written`` the pool slots the state comparison covers (None: the whole pool); ``memo`` keeps
    the term magnitudes (a float64 replay of the op) across the backends of one cell; ``o_dtype``
    the dtype the backend returned o in (float32, or the 16-bit activation dtype: OUTPUT_ROUNDING); ``rows``
    the rows of o compared (None: all)."""
    f = Figures(cell, inputs, expected, compute, written, Memo() if memo is None else memo, o_dtype, rows)
    terms = (FP32,)
    if f.state_dtype != "float32":
        terms += (STATE_16BIT, O_16BIT_POOL)
    terms += model.terms_on(cell.op)
    if f.state_dtype != "float32" and decoupled(f.compared.size, f.R, f.p):
        terms += (STATE_CHAIN,)
    if output_rounded(cell, model, o_dtype):
        terms += (OUTPUT_ROUNDING,)
    return fold(terms, f, (NONE, NONE))


def rounded_once(o: np.ndarray, dtype: str) -> np.ndarray:
    """The oracle's ``o`` rounded to nearest in the 16-bit ``dtype`` (through float32, as a kernel stores it),
    as float64; an element beyond the dtype's range keeps its value (no kernel output can match it)."""
    x = np.asarray(o, np.float64)
    with np.errstate(over="ignore"):
        r = x.astype(np.float32).astype(ACTIVATIONS[dtype]).astype(np.float64)
    return np.where(np.isfinite(r), r, x)


def output_rounded(cell: Cell, model: RoundingModel, o_dtype: str) -> bool:
    """Whether o (returned in ``o_dtype``) is judged against the oracle's o rounded to it (``OUTPUT_ROUNDING``):
    a 16-bit o, unless the model's oracle rounds o itself (FLA_CHUNK)."""
    return o_dtype != "float32" and FLA_CHUNK not in model.terms_on(cell.op)
