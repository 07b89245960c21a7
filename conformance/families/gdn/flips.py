"""GDN state tie flips seen in o: per rounding event of a 16-bit pool, the flips a float32 kernel can take
(its state and the oracle's on different sides of a rounding tie) and what each does to the o of the
later tokens that read the stored state.

One sequence's history is its tokens in order over every call of the cell (decode chains, recurrent
calls, spec decode drafts), with the tokens after which the state is rounded (``events``), as the
driver runs the op. In float64 with the op's q, k (l2 norm, scale), g and beta:

    token map      S -> M_t S + beta_t k_t v_t^T,  M_t = exp(g_t) (I - beta_t k_t k_t^T)   (per value column)
    o of token t   o_t = S_t^T q_t
    sensitivity    G_t = sum over later tokens t' > t of P^T q_t' q_t'^T P,  P = M_t' ... M_t+1,
                   by G_t = M_t+1^T (q_t+1 q_t+1^T + G_t+1) M_t+1 backwards from G = 0 at the end:
                   a change d of a stored column after token t changes the later o of that column by
                   sum_t' (q_t'^T P d)^2 = d^T G_t d.

At an event after token t the kernel's pre-rounding element S_kv differs from the oracle's by its float32
error (the random walk of FP32: sigma_kv = sqrt(n (K + C)) u32 T_kv, n the tokens since the last event, T_kv
the largest sum of |terms| of the element since then, plus u32 |S_kv| for the oracle's own step to float32)
and by the part of earlier flips the token maps moved off the 16-bit grid (X_kv below). Both round to
nearest: with the difference (m + f) ulp_kv the stored values differ by m or m + 1 ulps, a rounding noise r
of E r^2 = f (1 - f) ulp^2 <= min(E|off-grid part| / ulp, 1/4) ulp^2 =: p_kv ulp_kv^2 (ulp_kv the spacing of
the 16-bit dtype at S_kv), taken as a flip of weight w_kv = ulp_kv^2 G_t[k, k] with probability p_kv (the
noise's effect on the later o of its column; flips of independent signs: cross terms average out).
The carried difference D (post-rounding) is followed per element through the token maps: its second
moment V exactly for independent zero-mean elements (E s^2 = sum k^2 V for s = k^T D per column), a bound A
on its first moment (E|s| <= min(sum |k| A, sqrt(E s^2))), and X, the first moment of (M - I) D summed since
the last event: E|((M - I) D)_j| <= |a - 1| A_j + a beta |k_j| E|s|; each event adds sigma^2 + p ulp^2 to V.
``flip_weights`` returns the (p, w) of every element and event a later token reads, binned (``Flips``).
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import ml_dtypes
import numpy as np

from conformance.cells import Cell
from conformance.families.gdn.driver import DecodeAsRecurrent, run_with
from conformance.numerics import ACTIVATIONS, U32
from reference.gdn import numpy_ref as ref

F64 = np.dtype(np.float64)
FLIP_CAP = 0.25          # E rho^2 = f (1 - f) ulp^2 <= ulp^2 / 4
BINS_PER_OCTAVE = 4      # w binned by log2 in quarter octaves, each bin at its upper edge
LOG2_RANGE = (-1100, 100)  # the bins' range of log2(w): below it a flip weighs nothing a float64 sum keeps


@dataclass(frozen=True)
class Flips:
    """Flip probabilities summed per bin of weight: ``p[b]`` the expected flips whose weight is at most
    ``w[b]`` (and above the bin below); ``mean`` = sum of p w over all elements (unbinned)."""

    p: np.ndarray
    w: np.ndarray
    mean: float

    def tail(self, lam: float) -> float:
        """A bound on the sum of the weights of the flips that occur, exceeded with probability
        <= exp(-lam^2 / 2): Chernoff for independent Bernoulli terms, P(X >= x) <= exp(-theta x +
        sum p (exp(theta w) - 1)), minimised over theta (a log grid)."""
        if self.p.size == 0:
            return 0.0
        return _chernoff(lambda theta: float(np.sum(self.p * np.expm1(np.minimum(theta * self.w, 700.0)))),
                         float(np.max(self.w)), lam)


def bennett(mean: float, b: float, lam: float) -> float:
    """A bound on a sum of independent terms in [0, b] with total mean <= ``mean``, exceeded with probability
    <= exp(-lam^2 / 2): Chernoff with E exp(theta X_i) <= 1 + E X_i (exp(theta b) - 1) / b (convexity)."""
    if mean <= 0.0 or b <= 0.0:
        return 0.0
    return _chernoff(lambda theta: mean * math.expm1(min(theta * b, 700.0)) / b, b, lam)


def _chernoff(log_mgf, w_max: float, lam: float) -> float:
    """min over theta (a log grid around 1 / w_max) of (log_mgf(theta) + lam^2 / 2) / theta."""
    return min((log_mgf(theta) + lam ** 2 / 2) / theta for theta in np.logspace(-12, 3, 181) / w_max)


class _Recorder(DecodeAsRecurrent):
    """numpy_ref's op signatures: records each sequence's tokens (no arithmetic); the pool is left as is.
    A history continues where a later call reads the slot an earlier one wrote (decode chains, recurrent
    calls); a spec decode's sequence is one history."""

    def __init__(self):
        self.histories: dict = {}

    def _add(self, key, S0, rows, qs, ks, g, beta, events):
        h = self.histories.setdefault(key, {"S0": np.asarray(S0, F64), "q": [], "k": [], "v": [], "g": [],
                                            "beta": [], "event": []})
        for i, ev in zip(rows, events):
            for name, x in (("q", qs), ("k", ks), ("g", g), ("beta", beta)):
                h[name].append(x[i])
            h["v"].append(self._v[i])
            h["event"].append(ev)

    def recurrent(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
                  l2norm_eps=1e-6, state_write_interval=1, **_):
        qs, ks = ref.prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm, l2norm_eps, F64)
        self._v = np.asarray(v, F64)
        g, beta = np.asarray(g, F64), np.asarray(beta, F64)
        cu, idx = np.asarray(cu_seqlens), np.asarray(state_indices)
        for n in np.flatnonzero(idx >= 0):
            length = int(cu[n + 1] - cu[n])
            events = [(t + 1) % state_write_interval == 0 or t + 1 == length for t in range(length)]
            self._add(("slot", int(idx[n])), state[idx[n]], range(cu[n], cu[n + 1]), qs, ks, g, beta, events)
        return np.zeros(v.shape, np.float32)

    def chunked(self, *args, chunk_size=64, **kw):
        return self.recurrent(*args, **{**kw, "state_write_interval": chunk_size})

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, **_):
        qs, ks = ref.prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm, l2norm_eps, F64)
        self._v = np.asarray(v, F64)
        g, beta = ref.gating(A_log, a, b, dt_bias, compute_dtype="float64")
        cu, spec, acc = (np.asarray(x) for x in (cu_seqlens, spec_state_indices, num_accepted_tokens))
        start = spec[np.arange(len(acc)), np.maximum(acc - 1, 0)]
        for n in np.flatnonzero(start >= 0):
            rows = range(cu[n], cu[n + 1])
            self._add(("spec", int(n)), state[start[n]], rows, qs, ks, np.asarray(g, F64), np.asarray(beta, F64),
                      [True] * len(rows))
        return np.zeros(v.shape, np.float32)


def _apply_MT_X_M(X, a, beta, k):
    """M^T X M for M = a (I - beta k k^T) per head (symmetric X [HV,K,K])."""
    Xk = np.einsum("hij,hj->hi", X, k)                       # X k
    kXk = np.einsum("hi,hi->h", k, Xk)
    b = beta[:, None, None]
    Y = X - b * (k[:, :, None] * Xk[:, None, :] + Xk[:, :, None] * k[:, None, :]) \
        + (beta ** 2 * kXk)[:, None, None] * k[:, :, None] * k[:, None, :]
    return (a ** 2)[:, None, None] * Y


def _history_weights(h: dict, state_dtype, K: int, C: int, binned: np.ndarray) -> float:
    """Add one history's p at every event a later token reads into ``binned`` (by the bin of w,
    ``_bin``); returns its sum p w."""
    q, k, v, g, beta = (np.asarray(h[n], F64) for n in ("q", "k", "v", "g", "beta"))
    events = np.asarray(h["event"], bool)
    L = len(events)
    reads = np.flatnonzero(events[:-1])            # events with a later token (the last one has none)
    if reads.size == 0:
        return 0.0
    HV = q.shape[1]
    diag = {}
    G = np.zeros((HV, K, K))
    for t in range(L - 2, reads[0] - 1, -1):       # G_t from G_{t+1}
        X = G + q[t + 1][:, :, None] * q[t + 1][:, None, :]
        G = _apply_MT_X_M(X, np.exp(g[t + 1]), beta[t + 1], k[t + 1])
        if events[t]:
            diag[t] = np.einsum("hkk->hk", G).copy()
    total = 0.0
    S, since, T_max = h["S0"], 0, 0.0
    V = np.zeros_like(S)          # second moment of the carried difference D (post-rounding), per element
    A = np.zeros_like(S)          # a bound on its first moment E|D|
    X = np.zeros_like(S)          # a bound on E| part of D moved off the 16-bit grid since the last event |
    for t in range(reads[-1] + 1):
        a = np.exp(g[t]) * (1.0 + np.abs(g[t]))             # exp(g) with the gating's error (``terms``)
        u = np.abs(v[t]) + a[:, None] * np.einsum("hkv,hk->hv", np.abs(S), np.abs(k[t]))
        T_max = np.maximum(T_max, a[:, None, None] * np.abs(S)
                           + np.abs(beta[t])[:, None, None] * np.abs(k[t])[:, :, None] * u[:, None, :])
        V, A, off = _carry(V, A, np.exp(g[t]), beta[t], k[t])
        X = X + off
        S, _ = ref.token_step(S, q[t], k[t], v[t], g[t], beta[t])
        since += 1
        if not events[t]:
            continue
        stored = np.asarray(S, np.float32).astype(state_dtype)
        ulp = spacing(stored, state_dtype)
        sigma = math.sqrt(since * (K + C)) * U32 * T_max + U32 * np.abs(S)
        p = np.minimum(FLIP_CAP, (sigma + X) / ulp)
        if t in diag:
            w = np.square(ulp) * diag[t][:, :, None]
            binned += np.bincount(_bin(w).ravel(), weights=p.ravel(), minlength=binned.size)
            total += float(np.sum(p * w))
        V = V + np.square(sigma) + p * np.square(ulp)
        A = np.minimum(A + sigma + p * ulp, np.sqrt(V))
        S, since, T_max, X = stored.astype(F64), 0, 0.0, np.zeros_like(S)
    return total


def _carry(V, A, a, beta, k):
    """One token map M = a (I - beta k k^T) per head on a difference D [HV,K,V] of independent zero-mean
    elements with second moments V and first moments <= A: (V of M D, first-moment bound of M D, bound on
    E|((M - I) D)_j|). With s = k^T D per column: E s^2 = sum k^2 V (E[D_j s] = k_j V_j, so the second
    moments of (x_j - c k_j s) expand exactly) and E|s| <= min(sum |k| A, sqrt(E s^2))."""
    k2, ka = np.square(k)[:, :, None], np.abs(k)[:, :, None]
    s2 = np.sum(k2 * V, axis=1, keepdims=True)
    s1 = np.minimum(np.sum(ka * A, axis=1, keepdims=True), np.sqrt(s2))
    a, b = a[:, None, None], beta[:, None, None]
    moved = np.maximum(a ** 2 * (V * (1 - 2 * b * k2) + b ** 2 * k2 * s2), 0.0)
    off = np.abs(a - 1) * A + a * b * ka * s1
    A_moved = np.minimum(a * (np.abs(1 - b * k2) * A + b * ka * s1), np.sqrt(moved))
    return moved, A_moved, off


def spacing(x: np.ndarray, dtype) -> np.ndarray:
    """The distance from each 16-bit value to the next one away from zero (the smallest positive one at 0)."""
    info = ml_dtypes.finfo(dtype)
    mag = np.abs(x.astype(np.float64))
    exponent = np.floor(np.log2(np.maximum(mag, float(info.smallest_normal))))
    return np.exp2(exponent - info.nmant)


def _bin(w: np.ndarray) -> np.ndarray:
    """Index of the bin of each weight w: ceil(BINS_PER_OCTAVE log2 w) from the bottom of LOG2_RANGE (w = 0 and
    weights below the range in the lowest bin)."""
    lo, hi = LOG2_RANGE
    with np.errstate(divide="ignore"):
        edge = np.ceil(np.log2(w) * BINS_PER_OCTAVE)
    return (np.clip(edge, lo * BINS_PER_OCTAVE, hi * BINS_PER_OCTAVE) - lo * BINS_PER_OCTAVE).astype(np.int64)


def flip_weights(cell: Cell, inputs: dict) -> Flips:
    """``Flips`` of the cell's op on ``inputs`` (a 16-bit pool; not modified)."""
    rec = _Recorder()
    run_with(rec, cell, {**inputs, "state": np.asarray(inputs["state"]).astype(np.float64)})
    K, C = cell["K"], (64 if cell.op == "chunked" else 0)
    lo, hi = LOG2_RANGE
    binned = np.zeros((hi - lo) * BINS_PER_OCTAVE + 1)
    mean = sum(_history_weights(h, ACTIVATIONS[inputs["state_dtype"]], K, C, binned)
               for h in rec.histories.values())
    used = np.flatnonzero(binned[1:] > 0) + 1          # the lowest bin holds weights of no consequence
    return Flips(binned[used], np.exp2(used / BINS_PER_OCTAVE + lo), mean)
