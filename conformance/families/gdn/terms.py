"""GDN term magnitudes: the sum of |terms| behind each element of o and of the state, the scale of a
forward-error bound (a cancelling sum has a small result but not small rounding errors).

One token of one head, in float64 with q, k as the op prepares them (l2norm, q times scale):

    S_t = a S + beta k u^T,  u = v - a S^T k,  o_t = S_t^T q,  a = exp(g)
    |u|   <= |v| + a |S|^T |k|                                      ([V])
    o:     |S_t|^T |q| <= a |S|^T |q| + beta (|q|.|k|) |u|           ([V], either order of evaluation)
    state: a |S| + beta |k| |u|^T                                    ([K, V])

with S the state the token reads, and a taken as exp(g) (1 + |g|): a kernel's g is off by a few
u32 relative (``GATING``), which moves exp(g) by a few u32 |g| relative. ``magnitudes`` replays the
op's recurrence (sequences, slots and a two-call split as ``driver.run_with`` runs them) and returns
the largest of each over every token and head. It follows the exact recurrence: a 16-bit pool's
roundings and bf16 operands change a magnitude by u_bf16 (0.4%) relative at most.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell
from conformance.families.gdn.driver import DecodeAsRecurrent, run_with
from reference.gdn import numpy_ref as ref

F64 = np.dtype(np.float64)


def _token(S, q, k, v, g, beta) -> tuple[np.ndarray, float]:
    """S [HV,K,V], q, k [HV,K], v [HV,V], g, beta [HV] -> (o terms [HV,V], largest state term)."""
    a, b = np.exp(g) * (1.0 + np.abs(g)), np.abs(beta)
    absS = np.abs(S)
    u = np.abs(v) + a[:, None] * np.einsum("hkv,hk->hv", absS, np.abs(k))
    o = a[:, None] * np.einsum("hkv,hk->hv", absS, np.abs(q)) + (b * np.sum(np.abs(q * k), -1))[:, None] * u
    s = a[:, None, None] * absS + b[:, None, None] * np.abs(k)[:, :, None] * u[:, None, :]
    return o, float(np.max(s, initial=0.0))


class _Replay(DecodeAsRecurrent):
    """numpy_ref's op signatures (NumPy form: the pool updated in place); ``o`` holds the o terms,
    ``state_terms`` the largest state term seen."""

    def __init__(self):
        self.state_terms = 0.0

    def _run(self, q, k, v, g, beta, scale, use_qk_l2norm, l2norm_eps, seqs):
        """seqs: (read slot, [(token row, write slot)]) per real sequence."""
        qs, ks = ref.prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm, l2norm_eps, F64)
        v, g, beta = (np.asarray(x, F64) for x in (v, g, beta))
        o = np.zeros(v.shape, np.float64)
        for read, rows in seqs:
            S = np.asarray(self.pool[read], F64)
            for i, write in rows:
                o[i], s = _token(S, qs[i], ks[i], v[i], g[i], beta[i])
                self.state_terms = max(self.state_terms, s)
                S, _ = ref.token_step(S, qs[i], ks[i], v[i], g[i], beta[i])
                if write is not None:
                    self.pool[write] = S
        return o

    def recurrent(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None,
                  use_qk_l2norm=True, l2norm_eps=1e-6, **_):
        self.pool = state
        cu, idx = np.asarray(cu_seqlens), np.asarray(state_indices)
        seqs = [(idx[n], [(i, None) for i in range(cu[n], cu[n + 1] - 1)] + [(cu[n + 1] - 1, idx[n])])
                for n in np.flatnonzero(idx >= 0) if cu[n + 1] > cu[n]]
        return self._run(q, k, v, g, beta, scale, use_qk_l2norm, l2norm_eps, seqs)

    chunked = recurrent

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, **_):
        self.pool = state
        cu, spec, acc = (np.asarray(x) for x in (cu_seqlens, spec_state_indices, num_accepted_tokens))
        start = spec[np.arange(len(acc)), np.maximum(acc - 1, 0)]
        g, beta = ref.gating(A_log, a, b, dt_bias, compute_dtype="float64")
        seqs = [(start[n], [(i, spec[n, t]) for t, i in enumerate(range(cu[n], cu[n + 1]))])
                for n in np.flatnonzero(start >= 0)]
        return self._run(q, k, v, g, beta, scale, use_qk_l2norm, l2norm_eps, seqs)


def magnitudes(cell: Cell, inputs: dict) -> tuple[float, float]:
    """(largest o term sum, largest state term sum) of the cell's op on ``inputs`` (not modified)."""
    replay = _Replay()
    pool = np.asarray(inputs["state"]).astype(np.float64)
    o = run_with(replay, cell, {**inputs, "state": pool})["o"]
    return float(np.max(o, initial=0.0)), replay.state_terms
