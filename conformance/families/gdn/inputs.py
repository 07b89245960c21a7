"""GDN inputs: the input dict of a cell, drawn from ``cell.rng()``.

The activations (q, k, v, beta, a, b, dt_bias but under ``params`` "float32") are arrays of the cell's ``act`` dtype (ml_dtypes.bfloat16,
float16 or float32, rounded to nearest even from the draw); ``A_log`` is float32 holding bf16 values
(a model parameter), ``g`` float32 (the log decay), the state pool in the cell's state dtype:

    gating:       A_log [HV], a [T,HV], b [T,HV], dt_bias [HV] (a: N(0, 8), every 7th 25, every 11th -25;
                  the ``a`` "edge" cells: every third in ``GATE_EDGE``, past float32's exp range)
    recurrent:    q [T,H,K], k [T,H,K], v [T,HV,V], g [T,HV], beta [T,HV], cu_seqlens int32 [N+1],
                  state [S,HV,K,V] (pool in the cell's state dtype: float32, ml_dtypes.bfloat16, float16),
                  state_indices int32 [N] (shuffled, -1 = padding sequence), state_write_interval,
                  calls (each sequence fed in that many equal calls; 1 without the ``calls`` parameter)
    chunked:      as recurrent, with chunk_size and split (None, or the per-sequence token count
                  of the first of two calls; the second is seeded by the first's state)
    decode:       q [steps*N,H,K], k [steps*N,H,K], v [steps*N,HV,V], A_log, a [steps*N,HV],
                  b [steps*N,HV], dt_bias, state, state_indices [N], steps (rows s*N .. s*N+N-1 are
                  call s of a chain; 1 without the ``steps`` parameter)
    spec_decode:  q, k, v, A_log, a [T,HV], b [T,HV], dt_bias, state, spec_state_indices int32 [N,S],
                  num_accepted_tokens int32 [N] ("0", "1", "S" = S columns, "mix" cycling those three,
                  "ladder": sequence n of L drafts gets matrix.accepted_ladder(L)[n], cycled), cu_seqlens
    all but gating also: scale (None = 1/sqrt(K)), use_qk_l2norm, l2norm_eps, state_dtype (name)

A cell's ``params`` "float32" (gating, decode, spec_decode) gives A_log and dt_bias as checkpoints store them,
float32 at full precision beside activations of any dtype (``as_checkpoint``); the references compute the gates
in float32 from whatever float dtype each argument comes in, as the serving kernels upcast them.

A cell's ``pool`` (big pools) sets the pool's slot count; past 2^16 slots half the slots used lie past 65535
(``slot_draw``). The reference indexes the pool with int64, whatever its size.
"""
from __future__ import annotations

import math

import numpy as np

from conformance.cells import Cell, activation
from conformance.families.gdn.matrix import CHUNK, OPS, accepted_ladder
from conformance.numerics import bf16_round, to_activation
from reference.gdn.arguments import POOL_DTYPES


def head_magnitudes(n: int) -> np.ndarray:
    """Distinct per-head magnitudes 0.5 .. 2, so a wrong head mapping changes the numbers."""
    return np.float32(2.0) ** np.linspace(-1.0, 1.0, n, dtype=np.float32)


def log_decay(rng, decay: str, T: int, HV: int) -> np.ndarray:
    """g [T,HV]: strong ~ -0.5..-8 with 3% of tokens at -50; weak ~ -1e-3..-3e-2; zero = 0;
    near-one ~ log(0.99985 .. 0.99995); extreme ~ -20..-1e4 (log-uniform); steady ~ -1.4..-1.6 every
    token, so a 64-token chunk's local cumulative decay passes -88 (exp(-G) overflows float32) near its
    59th token and ends near -96: the reference takes exp(G_i - G_j) (j <= i) and exp(G_last - G_j) directly,
    every factor <= 1, never exp(-G_j)."""
    if decay == "steady":
        return rng.uniform(-1.6, -1.4, (T, HV)).astype(np.float32)
    if decay == "near-one":
        return np.log(rng.uniform(0.99985, 0.99995, (T, HV))).astype(np.float32)
    if decay == "extreme":
        return -np.exp(rng.uniform(math.log(20.0), math.log(1e4), (T, HV))).astype(np.float32)
    if decay == "strong":
        g = -np.exp(rng.uniform(math.log(0.5), math.log(8.0), (T, HV)))
        g[rng.random((T, HV)) < 0.03] = -50.0
        return g.astype(np.float32)
    if decay == "weak":
        return -rng.uniform(1e-3, 3e-2, (T, HV)).astype(np.float32)
    if decay == "zero":
        return np.zeros((T, HV), np.float32)
    raise ValueError(f"decay: expected {', '.join(DECAY_REGIMES)}, got {decay!r}")


DECAY_REGIMES = ("strong", "weak", "zero", "near-one", "extreme", "steady")
GATE_REGIMES = ("strong", "weak", "zero", "near-one", "extreme", "gate-edge")
GATE_EDGE = (100.0, 400.0)          # a + dt_bias past 88.7, where exp overflows float32


def gate_inputs(rng, decay: str, T: int, HV: int, act: str) -> dict:
    """A_log, a, b, dt_bias (``act`` dtype but A_log) whose gating gives the decay regime (zero:
    softplus(-60) ~ 1e-26; near-one: g ~ -1e-4 softplus(a), a ~ N(0, 0.5); extreme: g ~ -1e2..-1e4;
    gate-edge: every other token's a in ``GATE_EDGE`` (softplus's input past float32's exp range) with
    exp(A_log) 1e-3..1e-2, so g ~ -0.1..-4 still matters: the reference's softplus returns x above its
    threshold 20, never exp(x); the other tokens a ~ N(0, 1))."""
    if decay == "gate-edge":
        A_log, a = np.log(rng.uniform(1e-3, 1e-2, HV)), rng.normal(0.0, 1.0, (T, HV))
        a[::2] = rng.uniform(*GATE_EDGE, (len(a[::2]), HV))
    elif decay == "near-one":
        A_log, a = np.log(rng.uniform(5e-5, 1.5e-4, HV)), rng.normal(0.0, 0.5, (T, HV))
    elif decay == "extreme":
        A_log, a = np.log(rng.uniform(20.0, 2000.0, HV)), rng.normal(3.0, 1.0, (T, HV))
    elif decay == "strong":
        A_log, a = np.log(rng.uniform(0.5, 4.0, HV)), rng.normal(1.0, 1.5, (T, HV))
    elif decay == "weak":
        A_log, a = np.log(rng.uniform(1e-3, 1e-2, HV)), rng.normal(0.0, 1.0, (T, HV))
    elif decay == "zero":
        A_log, a = np.log(rng.uniform(0.5, 4.0, HV)), np.full((T, HV), -60.0)
    else:
        raise ValueError(f"decay: expected {', '.join(GATE_REGIMES)}, got {decay!r}")
    return {"A_log": bf16_round(A_log), "a": to_activation(a, act),
            "b": to_activation(rng.normal(0.0, 1.5, (T, HV)), act),
            "dt_bias": to_activation(rng.normal(0.0, 0.5, HV), act)}


def as_checkpoint(gates: dict, rng) -> dict:
    """The gate parameters as checkpoints store them: A_log and dt_bias float32 at full precision (not
    bf16 values, not the activations' dtype), dt_bias moved off the activation grid by a relative 1e-3."""
    dt_bias = np.asarray(gates["dt_bias"], np.float64)
    return {**gates, "A_log": np.asarray(gates["A_log"], np.float64).astype(np.float32)
            + rng.uniform(-1e-3, 1e-3, gates["A_log"].shape).astype(np.float32),
            "dt_bias": (dt_bias * (1.0 + rng.uniform(-1e-3, 1e-3, dt_bias.shape)) + 1e-3).astype(np.float32)}


QK_SCALE = {"unit": 1.0, "large": 2.0 ** 8}
KEY_SPREAD = {"near-duplicate": 1e-3, "correlated": 0.1}   # noise around one vector per head
V_NEAR_MAX = 6e4                                           # |v| cap: the edge of float16 (65504)


def keys(rng, T: int, H: int, K: int, how: str) -> np.ndarray:
    """k [T,H,K] before the per-head magnitudes: independent normal rows, or one normal vector per head
    plus ``KEY_SPREAD[how]`` times normal noise (near-duplicate: the rows agree to 1e-3)."""
    if how == "independent":
        return rng.normal(size=(T, H, K))
    if how not in KEY_SPREAD:
        raise ValueError(f"keys: expected independent, {', '.join(KEY_SPREAD)}, got {how!r}")
    return rng.normal(size=(1, H, K)) + KEY_SPREAD[how] * rng.normal(size=(T, H, K))


def values(rng, T: int, HV: int, V: int, how: str) -> np.ndarray:
    """v [T,HV,V]: normal times the per-head magnitudes (unit), or near-max: normal times 2e4, clipped
    to +-V_NEAR_MAX."""
    v = rng.normal(size=(T, HV, V)) * head_magnitudes(HV)[None, :, None]
    if how == "unit":
        return v
    if how == "near-max":
        return np.clip(v * 2e4, -V_NEAR_MAX, V_NEAR_MAX)
    raise ValueError(f"v: expected unit or near-max, got {how!r}")


def qkv(rng, T: int, H: int, HV: int, K: int, V: int, qk: str, act: str, key_gen: str = "independent",
        v_gen: str = "unit") -> dict:
    """Independent q, k, v (never the same tensor) in ``act``, per-head magnitudes; q and k times
    ``QK_SCALE[qk]``; k from ``keys(key_gen)``, v from ``values(v_gen)``."""
    q = rng.normal(size=(T, H, K)) * head_magnitudes(H)[None, :, None] * QK_SCALE[qk]
    k = keys(rng, T, H, K, key_gen) * head_magnitudes(H)[::-1][None, :, None] * QK_SCALE[qk]
    v = values(rng, T, HV, V, v_gen)
    return {"q": to_activation(q, act), "k": to_activation(k, act), "v": to_activation(v, act)}


def betas(rng, T: int, HV: int, how: str) -> np.ndarray:
    """beta [T,HV]: sigmoid of N(0, 1.5), or edges: exactly 0 or 1 (half each)."""
    if how == "sigmoid":
        return 1.0 / (1.0 + np.exp(-rng.normal(0.0, 1.5, (T, HV))))
    if how == "edges":
        return (rng.random((T, HV)) < 0.5).astype(np.float64)
    raise ValueError(f"beta: expected sigmoid or edges, got {how!r}")


def _gates(rng, cell: Cell, T: int, HV: int, act: str) -> dict:
    """``gate_inputs`` of the cell's decay; with ``params`` "float32", as checkpoints store them."""
    gates = gate_inputs(rng, cell["decay"], T, HV, act)
    return as_checkpoint(gates, rng) if cell.get("params") == "float32" else gates


def _generators(cell: Cell) -> dict:
    return {"key_gen": cell.get("keys", "independent"), "v_gen": cell.get("v", "unit")}


GROWN_STATE = 3e4      # a pool's spread after a long chain fed |v| ~ 2e4: the unscaled readout passes 65504


def state_pool(rng, state: str, slots: int, HV: int, K: int, V: int, spread: float = 0.5) -> np.ndarray:
    """A pool [slots, HV, K, V] in the state dtype ``state``: normal with standard deviation ``spread``
    times the per-head magnitudes."""
    S = rng.normal(0.0, spread, (slots, HV, K, V)) * head_magnitudes(HV)[None, :, None, None]
    return S.astype(np.float32).astype(POOL_DTYPES[state])


INDEX_16BIT = 1 << 16


def slot_draw(rng, n: int, pool_size: int) -> np.ndarray:
    """``n`` distinct slots of a pool, int32: a random permutation's first n; in a pool past 2^16 slots,
    half of them (rounded up) from the slots past 65535, which 16-bit index arithmetic wraps."""
    if pool_size <= INDEX_16BIT:
        return rng.permutation(pool_size)[:n].astype(np.int32)
    high = INDEX_16BIT + rng.permutation(pool_size - INDEX_16BIT)[: n - n // 2]
    return rng.permutation(np.concatenate([high, rng.permutation(INDEX_16BIT)[: n // 2]])).astype(np.int32)


def _options(cell: Cell) -> dict:
    return {"scale": None, "use_qk_l2norm": True, "l2norm_eps": 1e-6, "state_dtype": cell["state"]}


def _with_padding(lens: tuple, padded: bool) -> tuple[list[int], int | None]:
    """Sequence lengths with a padding sequence (5 tokens) inserted at position 1 when padded."""
    lens = list(lens)
    if not padded:
        return lens, None
    pos = min(1, len(lens))
    lens.insert(pos, 5)
    return lens, pos


def make_inputs(cell: Cell) -> dict:
    """The input dict of a cell (keys in the module docstring), drawn from ``cell.rng()``."""
    rng, act = cell.rng(), activation(cell)
    if cell.op == "gating":
        T, HV = cell["T"], cell["HV"]
        a = rng.normal(0.0, 8.0, (T, HV))
        a.flat[:: 7] = 25.0                     # above the softplus threshold
        a.flat[3:: 11] = -25.0                  # far below it
        if cell.get("a") == "edge":             # past float32's exp range: softplus(x) = x above 20
            a.flat[1:: 3] = rng.uniform(*GATE_EDGE, len(a.flat[1:: 3]))
        gates = {"A_log": bf16_round(np.log(rng.uniform(0.5, 16.0, HV))), "a": to_activation(a, act),
                 "b": to_activation(rng.normal(0.0, 4.0, (T, HV)), act),
                 "dt_bias": to_activation(rng.normal(0.0, 1.0, HV), act)}
        return as_checkpoint(gates, rng) if cell.get("params") == "float32" else gates
    H, HV, K = cell["H"], cell["HV"], cell["K"]
    V = cell.get("V", K)
    padded = cell["slots"] == "padded"
    qk = cell.get("qk", "unit")
    if cell.op in ("recurrent", "chunked"):
        lens, pad_at = _with_padding(cell["lens"], padded)
        T, N = sum(lens), len(lens)
        inputs = {**qkv(rng, T, H, HV, K, V, qk, act, **_generators(cell)),
                  "g": log_decay(rng, cell["decay"], T, HV),
                  "beta": to_activation(betas(rng, T, HV, cell.get("beta", "sigmoid")), act),
                  "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)}
        real = N - (pad_at is not None)
        pool_size = cell.get("pool", real + 2)
        idx = slot_draw(rng, real, pool_size)
        if pad_at is not None:
            idx = np.insert(idx, pad_at, -1).astype(np.int32)
        inputs.update(state=state_pool(rng, cell["state"], pool_size, HV, K, V), state_indices=idx,
                      **_options(cell))
        if cell.op == "recurrent":
            inputs.update(state_write_interval=cell["interval"], calls=cell.get("calls", 1))
        else:
            inputs.update(chunk_size=CHUNK, split=cell["split"])
        return inputs
    if cell.op == "decode":
        N, steps = cell["N"] + padded, cell.get("steps", 1)
        inputs = {**qkv(rng, steps * N, H, HV, K, V, qk, act, **_generators(cell)),
                  **_gates(rng, cell, steps * N, HV, act), "steps": steps}
        pool_size = cell.get("pool", cell["N"] + 2)
        idx = slot_draw(rng, cell["N"], pool_size)
        if padded:
            idx = np.insert(idx, min(1, cell["N"]), -1).astype(np.int32)
        inputs.update(state=state_pool(rng, cell["state"], pool_size, HV, K, V), state_indices=idx,
                      **_options(cell))
        return inputs
    if cell.op == "spec_decode":
        lens, pad_at = _with_padding(cell["drafts"], padded)
        if pad_at is not None:
            lens[pad_at] = 2
        N, S = len(lens), max(max(lens), 4)
        T = sum(lens)
        inputs = {**qkv(rng, T, H, HV, K, V, qk, act, **_generators(cell)), **_gates(rng, cell, T, HV, act)}
        pool_size = cell.get("pool", N * S + 2)
        spread = GROWN_STATE if cell.get("v") == "near-max" else 0.5
        spec = slot_draw(rng, N * S, pool_size).reshape(N, S)
        mode = cell["accepted"]
        if mode == "ladder":        # the n-th real sequence of L drafts: the n-th of accepted_ladder(L), cycled
            real = [L for n, L in enumerate(lens) if n != pad_at]
            ladder = [accepted_ladder(L)[n % len(accepted_ladder(L))] for n, L in enumerate(real)]
            if pad_at is not None:
                ladder.insert(pad_at, 0)
            accepted = np.array(ladder, np.int32)
        else:
            modes = [mode] * N if mode != "mix" else [("0", "1", "S")[n % 3] for n in range(N)]
            accepted = np.array([{"0": 0, "1": 1, "S": S}[m] for m in modes], np.int32)
        if pad_at is not None:
            spec[pad_at] = -1
        inputs.update(state=state_pool(rng, cell["state"], pool_size, HV, K, V, spread), spec_state_indices=spec,
                      num_accepted_tokens=accepted,
                      cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                      **_options(cell))
        return inputs
    raise ValueError(f"cell.op: expected one of {OPS}, got {cell.op!r}")
