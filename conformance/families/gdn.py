"""The GDN family: ops gating, recurrent, chunked, decode, spec_decode.

Input dicts (``make_inputs``); every float array is float32 holding bf16-representable values
(kernels that take bf16 see the same numbers), except ``g`` (fp32 log decay) and the state pool:

    gating:       A_log [HV], a [T,HV], b [T,HV], dt_bias [HV]
    recurrent:    q [T,H,K], k [T,H,K], v [T,HV,V], g [T,HV], beta [T,HV], cu_seqlens int32 [N+1],
                  state [S,HV,K,V] (pool in the cell's state dtype: float32, ml_dtypes.bfloat16, float16),
                  state_indices int32 [N] (shuffled, -1 = padding sequence), state_write_interval
    chunked:      as recurrent, with chunk_size and split (None, or the per-sequence token count
                  of the first of two calls; the second is seeded by the first's state)
    decode:       q [N,H,K], k [N,H,K], v [N,HV,V], A_log, a [N,HV], b [N,HV], dt_bias,
                  state, state_indices [N]
    spec_decode:  q, k, v, A_log, a [T,HV], b [T,HV], dt_bias, state, spec_state_indices int32 [N,S],
                  num_accepted_tokens int32 [N], cu_seqlens
    all but gating also: scale (None = 1/sqrt(K)), use_qk_l2norm, l2norm_eps, state_dtype (name)

Outputs (``run_with``): gating {"g", "beta"} float32 [T,HV]; the others {"o": float32 [T,HV,V],
"state": the whole pool as float32}. Rows of ``o`` that belong to padding sequences are unspecified.

Oracles (``check``): rounding model "exact" -> ``numpy_ref`` in float64 (the chunked op against the
*recurrent* form rounded every chunk_size tokens, so the chunk algebra is checked too);
"bf16-operands" (chunked only) -> ``numpy_ref.chunked(operand_dtype="bfloat16")`` in float64;
"bf16-gemm" (torch-eager) -> the bf16-operands oracle with room for bf16-rounded GEMM results.
Quality: error against the float32-state truth (float64 recurrent, fp32 pool).
"""
from __future__ import annotations

import math
from collections import OrderedDict

import ml_dtypes
import numpy as np

from conformance.cells import Cell, make_cell
from conformance.compare import Comparison, Tolerance, compare, verdict
from conformance.covering import pairwise
from reference.gdn.arguments import STATE_DTYPES

FAMILY = "gdn"
OPS = ("gating", "recurrent", "chunked", "decode", "spec_decode")
CHUNK = 64
ROUNDING_MODELS = ("exact", "bf16-operands", "bf16-gemm")

# ---------------------------------------------------------------------------- the matrix

STATES = ["float32", "bfloat16", "float16"]
HEADS = [(4, 4), (2, 4), (4, 12), (16, 32)]
DECAYS = ["strong", "weak", "zero"]
SLOTS = ["shuffled", "padded"]


def _axes(op: str, tier: str) -> dict:
    """Axes of one op in a tier, in cell-id order."""
    full = tier == "full"
    if op == "gating":
        return {"HV": [4, 12, 32], "T": [1, 9, 65] + ([2048] if full else [])}
    K = [64, 128] if full else [64]
    if op in ("recurrent", "chunked"):
        lens = [(1,), (63,), (64,), (65,), (1, 2, 3), (63, 64, 65)]
        if full:
            lens += [(127, 128, 129), (273,), (2048,), (1, 273, 64), (5, 2048)]
        last = ({"interval": [1, 16, 64]} if op == "recurrent"
                else {"split": [None, 64, 37] + ([128, 100] if full else [])})
        return {"state": STATES, "heads": HEADS, "K": K, "lens": lens, "decay": DECAYS,
                "slots": SLOTS, **last}
    if op == "decode":
        KV = [(64, 64), (128, 128), (128, 64), (64, 128)] if full else [(64, 64), (64, 32), (32, 64)]
        return {"state": STATES, "heads": HEADS, "KV": KV, "N": [1, 3, 8], "decay": DECAYS,
                "slots": SLOTS}
    if op == "spec_decode":
        return {"state": STATES, "heads": HEADS, "K": K, "drafts": [(4,), (1, 3, 4), (2, 4, 4, 1)],
                "accepted": ["0", "1", "S", "mix"], "decay": DECAYS, "slots": SLOTS}
    raise ValueError(f"op: expected one of {OPS}, got {op!r}")


def _valid(row: dict) -> bool:
    split = row.get("split")
    if split is not None and "lens" in row and max(row["lens"]) <= split:
        return False
    return True


def _corners(op: str, tier: str) -> list[dict]:
    """Named corners: real model shapes and chunk edges at K=128 (small in ci)."""
    if op == "recurrent":
        return [dict(state="bfloat16", heads=(4, 12), K=128, lens=(127, 128, 129), decay="weak",
                     slots="padded", interval=64)]
    if op == "chunked":
        out = [dict(state="bfloat16", heads=(4, 12), K=128, lens=(127, 128, 129), decay="weak",
                    slots="shuffled", split=None),
               dict(state="float16", heads=(2, 4), K=128, lens=(273,), decay="weak", slots="padded",
                    split=100),
               dict(state="float32", heads=(2, 4), K=64, lens=(273,), decay="zero", slots="shuffled",
                    split=128)]
        if tier == "full":
            out.append(dict(state="bfloat16", heads=(16, 32), K=128, lens=(2048,), decay="weak",
                            slots="shuffled", split=1024))
        return out
    if op == "decode":
        return [dict(state="bfloat16", heads=(16, 32), KV=(128, 128), N=4, decay="strong",
                     slots="padded")]
    if op == "spec_decode":
        return [dict(state="bfloat16", heads=(4, 12), K=128, drafts=(4, 2), accepted="mix",
                     decay="weak", slots="padded")]
    return []


def _cell(op: str, row: dict) -> Cell:
    params = {}
    for name, value in row.items():
        if name == "heads":
            params["H"], params["HV"] = value
        elif name == "KV":
            params["K"], params["V"] = value
        else:
            params[name] = value
    return make_cell(FAMILY, op, **params)


def cells(tier: str) -> list[Cell]:
    """The gdn cells of a tier (smoke, ci, full), in OPS order, deterministic."""
    if tier == "smoke":
        return [
            make_cell(FAMILY, "gating", HV=12, T=9),
            _cell("recurrent", dict(state="bfloat16", heads=(2, 4), K=64, lens=(1, 2, 3), decay="weak",
                                    slots="padded", interval=1)),
            _cell("chunked", dict(state="bfloat16", heads=(2, 4), K=64, lens=(63, 65), decay="weak",
                                  slots="shuffled", split=37)),
            _cell("decode", dict(state="float16", heads=(4, 12), KV=(64, 32), N=3, decay="strong",
                                 slots="padded")),
            _cell("spec_decode", dict(state="float32", heads=(2, 4), K=64, drafts=(1, 3, 4),
                                      accepted="mix", decay="weak", slots="padded")),
        ]
    if tier not in ("ci", "full"):
        raise ValueError(f"tier: expected smoke, ci or full, got {tier!r}")
    out = []
    for op in OPS:
        rows = pairwise(_axes(op, tier), _valid) + _corners(op, tier)
        out += [_cell(op, row) for row in rows]
    return out


# ---------------------------------------------------------------------------- inputs

def _bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 array holding the nearest bf16 values of x."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _head_magnitudes(n: int) -> np.ndarray:
    """Distinct per-head magnitudes 0.5 .. 2, so a wrong head mapping changes the numbers."""
    return np.float32(2.0) ** np.linspace(-1.0, 1.0, n, dtype=np.float32)


def _log_decay(rng, decay: str, T: int, HV: int) -> np.ndarray:
    """g [T,HV]: strong ~ -0.5..-8 with 3% of tokens at -50; weak ~ -1e-3..-3e-2; zero = 0."""
    if decay == "strong":
        g = -np.exp(rng.uniform(math.log(0.5), math.log(8.0), (T, HV)))
        g[rng.random((T, HV)) < 0.03] = -50.0
        return g.astype(np.float32)
    if decay == "weak":
        return -rng.uniform(1e-3, 3e-2, (T, HV)).astype(np.float32)
    if decay == "zero":
        return np.zeros((T, HV), np.float32)
    raise ValueError(f"decay: expected strong, weak or zero, got {decay!r}")


def _gate_inputs(rng, decay: str, T: int, HV: int) -> dict:
    """A_log, a, b, dt_bias whose gating gives the decay regime (zero: softplus(-60) ~ 1e-26)."""
    if decay == "strong":
        A_log, a = np.log(rng.uniform(0.5, 4.0, HV)), rng.normal(1.0, 1.5, (T, HV))
    elif decay == "weak":
        A_log, a = np.log(rng.uniform(1e-3, 1e-2, HV)), rng.normal(0.0, 1.0, (T, HV))
    elif decay == "zero":
        A_log, a = np.log(rng.uniform(0.5, 4.0, HV)), np.full((T, HV), -60.0)
    else:
        raise ValueError(f"decay: expected strong, weak or zero, got {decay!r}")
    return {"A_log": _bf16_values(A_log), "a": _bf16_values(a),
            "b": _bf16_values(rng.normal(0.0, 1.5, (T, HV))),
            "dt_bias": _bf16_values(rng.normal(0.0, 0.5, HV))}


def _qkv(rng, T: int, H: int, HV: int, K: int, V: int) -> dict:
    """Independent q, k, v (never the same tensor), per-head magnitudes."""
    q = rng.normal(size=(T, H, K)) * _head_magnitudes(H)[None, :, None]
    k = rng.normal(size=(T, H, K)) * _head_magnitudes(H)[::-1][None, :, None]
    v = rng.normal(size=(T, HV, V)) * _head_magnitudes(HV)[None, :, None]
    return {"q": _bf16_values(q), "k": _bf16_values(k), "v": _bf16_values(v)}


def _pool(rng, state: str, slots: int, HV: int, K: int, V: int) -> np.ndarray:
    S = rng.normal(0.0, 0.5, (slots, HV, K, V)) * _head_magnitudes(HV)[None, :, None, None]
    return S.astype(np.float32).astype(STATE_DTYPES[state])


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
    rng = cell.rng()
    if cell.op == "gating":
        T, HV = cell["T"], cell["HV"]
        a = rng.normal(0.0, 8.0, (T, HV))
        a.flat[:: 7] = 25.0                     # above the softplus threshold
        a.flat[3:: 11] = -25.0                  # far below it
        return {"A_log": _bf16_values(np.log(rng.uniform(0.5, 16.0, HV))), "a": _bf16_values(a),
                "b": _bf16_values(rng.normal(0.0, 4.0, (T, HV))),
                "dt_bias": _bf16_values(rng.normal(0.0, 1.0, HV))}
    H, HV, K = cell["H"], cell["HV"], cell["K"]
    V = cell.get("V", K)
    padded = cell["slots"] == "padded"
    if cell.op in ("recurrent", "chunked"):
        lens, pad_at = _with_padding(cell["lens"], padded)
        T, N = sum(lens), len(lens)
        inputs = {**_qkv(rng, T, H, HV, K, V), "g": _log_decay(rng, cell["decay"], T, HV),
                  "beta": _bf16_values(1.0 / (1.0 + np.exp(-rng.normal(0.0, 1.5, (T, HV))))),
                  "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)}
        real = N - (pad_at is not None)
        pool_size = real + 2
        idx = rng.permutation(pool_size)[:real].astype(np.int32)
        if pad_at is not None:
            idx = np.insert(idx, pad_at, -1).astype(np.int32)
        inputs.update(state=_pool(rng, cell["state"], pool_size, HV, K, V), state_indices=idx,
                      **_options(cell))
        if cell.op == "recurrent":
            inputs["state_write_interval"] = cell["interval"]
        else:
            inputs.update(chunk_size=CHUNK, split=cell["split"])
        return inputs
    if cell.op == "decode":
        N = cell["N"] + padded
        inputs = {**_qkv(rng, N, H, HV, K, V), **_gate_inputs(rng, cell["decay"], N, HV)}
        pool_size = cell["N"] + 2
        idx = rng.permutation(pool_size)[:cell["N"]].astype(np.int32)
        if padded:
            idx = np.insert(idx, min(1, cell["N"]), -1).astype(np.int32)
        inputs.update(state=_pool(rng, cell["state"], pool_size, HV, K, V), state_indices=idx,
                      **_options(cell))
        return inputs
    if cell.op == "spec_decode":
        lens, pad_at = _with_padding(cell["drafts"], padded)
        if pad_at is not None:
            lens[pad_at] = 2
        N, S = len(lens), max(max(lens), 4)
        T = sum(lens)
        inputs = {**_qkv(rng, T, H, HV, K, V), **_gate_inputs(rng, cell["decay"], T, HV)}
        pool_size = N * S + 2
        spec = rng.permutation(pool_size)[: N * S].reshape(N, S).astype(np.int32)
        mode = cell["accepted"]
        modes = [mode] * N if mode != "mix" else [("0", "1", "S")[n % 3] for n in range(N)]
        accepted = np.array([{"0": 0, "1": 1, "S": S}[m] for m in modes], np.int32)
        if pad_at is not None:
            spec[pad_at] = -1
        inputs.update(state=_pool(rng, cell["state"], pool_size, HV, K, V), spec_state_indices=spec,
                      num_accepted_tokens=accepted,
                      cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                      **_options(cell))
        return inputs
    raise ValueError(f"cell.op: expected one of {OPS}, got {cell.op!r}")


# ---------------------------------------------------------------------------- running an impl

def _f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def _invoke(fn, args: tuple, kwargs: dict, state):
    """Call an op in NumPy form (mutates the pool, returns o) or JAX form (returns (o, pool))."""
    result = fn(*args, **kwargs)
    if isinstance(result, tuple):
        return result
    return result, state


def _varlen_calls(fn, inputs: dict, kwargs: dict):
    """One call, or two calls split at ``inputs['split']`` tokens of every sequence."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    cu, idx, state, split = inputs["cu_seqlens"], inputs["state_indices"], inputs["state"], inputs.get("split")
    if split is None:
        return _invoke(fn, (q, k, v, g, beta, cu, state, idx), kwargs, state)
    o = np.zeros((q.shape[0],) + tuple(v.shape[1:]), np.float32)
    starts, ends = cu[:-1].astype(np.int64), cu[1:].astype(np.int64)
    parts = [(starts, np.minimum(starts + split, ends), np.ones(len(starts), bool)),
             (starts + split, ends, ends - starts > split)]
    for lo, hi, keep in parts:
        tokens = np.concatenate([np.arange(a, b) for a, b, kept in zip(lo, hi, keep) if kept])
        sub_cu = np.concatenate([[0], np.cumsum((hi - lo)[keep])]).astype(np.int32)
        part_o, state = _invoke(fn, (q[tokens], k[tokens], v[tokens], g[tokens], beta[tokens], sub_cu,
                                     state, idx[keep]), kwargs, state)
        o[tokens] = _f32(part_o)
    return o, state


def run_with(impl, cell: Cell, inputs: dict) -> dict:
    """Run the cell's op through ``impl`` (a module/object with the reference's function names,
    NumPy in-place or JAX functional semantics); returns the outputs dict."""
    if cell.op == "gating":
        g, beta = impl.gating(inputs["A_log"], inputs["a"], inputs["b"], inputs["dt_bias"])
        return {"g": _f32(g), "beta": _f32(beta)}
    opts = {n: inputs[n] for n in ("scale", "use_qk_l2norm", "l2norm_eps", "state_dtype")}
    state = inputs["state"]
    if cell.op == "recurrent":
        o, state = _varlen_calls(impl.recurrent, inputs,
                                 {**opts, "state_write_interval": inputs["state_write_interval"]})
    elif cell.op == "chunked":
        o, state = _varlen_calls(impl.chunked, inputs, {**opts, "chunk_size": inputs["chunk_size"]})
    elif cell.op == "decode":
        args = tuple(inputs[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias"))
        o, state = _invoke(impl.decode, args + (state, inputs["state_indices"]), opts, state)
    elif cell.op == "spec_decode":
        args = tuple(inputs[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias"))
        o, state = _invoke(impl.spec_decode, args + (state, inputs["spec_state_indices"],
                                                     inputs["num_accepted_tokens"], inputs["cu_seqlens"]),
                           opts, state)
    else:
        raise ValueError(f"cell.op: expected one of {OPS}, got {cell.op!r}")
    return {"o": _f32(o), "state": _f32(state)}


# ---------------------------------------------------------------------------- oracles

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
    """Which oracle a backend of this rounding model is held to on this cell."""
    if rounding_model not in ROUNDING_MODELS:
        raise ValueError(f"rounding_model: expected one of {ROUNDING_MODELS}, got {rounding_model!r}")
    if cell.op == "chunked" and rounding_model != "exact":
        return "bf16-operands"
    return "exact"


_ORACLES: OrderedDict = OrderedDict()
_ORACLE_CACHE_SIZE = 8


def oracle(cell: Cell, inputs: dict, kind: str, truth: bool = False) -> dict:
    """Oracle outputs for (cell, kind), cached in-process. ``truth``: the float32-state run."""
    key = (cell, kind, truth)
    if key not in _ORACLES:
        if truth:
            inputs = {**inputs, "state": inputs["state"].astype(np.float32), "state_dtype": "float32"}
        impl = Float64Oracle("bfloat16" if kind == "bf16-operands" else "float32")
        if "state" in inputs:
            inputs = {**inputs, "state": inputs["state"].copy()}
        _ORACLES[key] = run_with(impl, cell, inputs)
        while len(_ORACLES) > _ORACLE_CACHE_SIZE:
            _ORACLES.popitem(last=False)
    _ORACLES.move_to_end(key)
    return _ORACLES[key]


# ---------------------------------------------------------------------------- tolerances

U32 = 2.0 ** -24
UNIT = {"float32": U32, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def _longest(cell: Cell, inputs: dict) -> int:
    if cell.op == "decode":
        return 1
    return int(np.max(np.diff(inputs["cu_seqlens"])))


def _interval(cell: Cell, inputs: dict) -> int:
    """Tokens between state roundings (decode and spec_decode: every token)."""
    if cell.op == "recurrent":
        return inputs["state_write_interval"]
    return CHUNK if cell.op == "chunked" else 1


def _roundings(L: int, interval: int, split: int | None) -> int:
    """State roundings of an L-token sequence (a two-call split adds one at the split)."""
    if split is None or L <= split:
        return math.ceil(L / interval)
    return math.ceil(split / interval) + math.ceil((L - split) / interval)


def _tolerances(cell: Cell, inputs: dict, expected: dict, model: str) -> tuple[Tolerance, Tolerance]:
    """(o tolerance, state tolerance) for a backend of ``model`` against its oracle.

    fp32 arithmetic: each token's dot products of length K (chunked: K + chunk) carry ~sqrt(K) u32
    relative error; the state map S -> exp(g)(I - beta k k^T) S is non-expansive, so errors of L
    tokens add up like a random walk: err <= 16 sqrt(L (K + C)) u32 * max|x|.
    16-bit state: fp32 and the oracle's fp64 land on different sides of a rounding tie with
    probability p ~ sqrt(K+C) u32 / u per element and rounding; a flip moves a stored element by one
    ulp (2u of the state dtype), and flips of R roundings add like a random walk: elementwise
    4u max|S|, norm-wise rel_l2 <= 2 * 2u sqrt(R p) = 4 sqrt(R sqrt(K+C) u32 u). A biased rounding
    (truncation) costs ~u on every element at every rounding, well above that bound.
    bf16 operands: a flip of one bf16 operand rounding moves a product by 2u_bf16 of one term:
    elementwise 8 u_bf16 max|x|, rel_l2 <= u_bf16 / 4 per chunk; the state also takes the extra
    16-bit storage flips those differences cause: rel_l2 <= u_bf16 / 2. Each chunk makes new flips
    and the carried state keeps the old ones (with zero decay it forgets nothing), so the norm-wise
    bounds grow like a random walk over the chunks: x sqrt(chunks). bf16 GEMM results (bf16-gemm) round every
    product sum once more, three in a row on the way to o and to the state increment (W@S, then
    v_new, then the readout / k^T v_new): 32 u_bf16 max|x|, rel_l2 <= 3 u_bf16.
    """
    sname = inputs["state_dtype"]
    L, K = _longest(cell, inputs), cell["K"]
    C = CHUNK if cell.op == "chunked" else 0
    reach = math.sqrt(L * (K + C))
    o_max = float(np.max(np.abs(expected["o"]))) or 1.0
    s_max = float(np.max(np.abs(expected["state"]))) or 1.0
    fp32 = 16 * reach * U32
    why = f"fp32: 16*sqrt(L={L}*(K+C))*u32 of max|x|"
    o_atol, s_atol, o_l2, s_l2 = fp32 * o_max, fp32 * s_max, None, None
    if sname != "float32":
        u = UNIT[sname]
        R = _roundings(L, _interval(cell, inputs), inputs.get("split"))
        o_atol += 4 * u * s_max / math.sqrt(K)
        s_atol += 4 * u * s_max
        s_l2 = 4 * math.sqrt(R * math.sqrt(K + C) * U32 * u)
        why += (f"; {sname} state, {R} roundings: tie flips <= 4u max|S| (o: /sqrt(K)), "
                f"state rel_l2 <= 4 sqrt(R sqrt(K+C) u32 u) (u={u:g})")
    if model == "bf16-operands":
        ub = UNIT["bfloat16"]
        walk = math.sqrt(_roundings(L, CHUNK, inputs.get("split"))) if cell.op == "chunked" else 1.0
        o_atol += 8 * ub * o_max
        s_atol += 8 * ub * s_max
        o_l2, s_l2 = walk * ub / 4, max(s_l2 or 0.0, walk * ub / 2)
        why += ("; bf16 operands: one-operand flips <= 8u_bf16 max|x|, rel_l2 <= u_bf16/4 (state u_bf16/2),"
                f" new flips in each chunk add like a random walk over the carried state: x sqrt(chunks)"
                f" = {walk:.3g}")
    elif model == "bf16-gemm":
        ub = UNIT["bfloat16"]
        o_atol += 32 * ub * o_max
        s_atol += 32 * ub * s_max
        o_l2, s_l2 = 3 * ub, max(s_l2 or 0.0, 3 * ub)
        why += "; bf16 GEMM results: 32u_bf16 max|x|, rel_l2 <= 3u_bf16"
    return (Tolerance(o_atol, 16 * U32 * K, why, rel_l2=o_l2),
            Tolerance(s_atol, 16 * U32 * K, why, rel_l2=s_l2))


GATING_TOL = Tolerance(
    0.0, 16 * U32,
    "fp32 gating: exp, log1p, sigmoid each <= 2 ulp, products <= 1 ulp: 16 u32 relative")


# ---------------------------------------------------------------------------- check

def _real_sequences(cell: Cell, inputs: dict) -> np.ndarray:
    """Indices of the non-padding sequences (decode: of the tokens)."""
    if cell.op == "spec_decode":
        spec, acc = inputs["spec_state_indices"], inputs["num_accepted_tokens"]
        return np.flatnonzero(spec[np.arange(len(acc)), np.maximum(acc - 1, 0)] >= 0)
    return np.flatnonzero(inputs["state_indices"] >= 0)


def _real_rows(cell: Cell, inputs: dict) -> np.ndarray:
    """Token rows of ``o`` that belong to non-padding sequences."""
    real = _real_sequences(cell, inputs)
    if cell.op == "decode":
        return real
    cu = inputs["cu_seqlens"]
    return np.concatenate([np.arange(cu[n], cu[n + 1]) for n in real])


def _written_slots(cell: Cell, inputs: dict) -> np.ndarray:
    """Pool slots the op stores into (sorted)."""
    if cell.op == "spec_decode":
        cu, spec = inputs["cu_seqlens"], inputs["spec_state_indices"]
        slots = np.concatenate([spec[n, : cu[n + 1] - cu[n]] for n in _real_sequences(cell, inputs)])
        return np.sort(slots).astype(np.int64)
    idx = inputs["state_indices"]
    return np.sort(idx[idx >= 0]).astype(np.int64)


def _rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    norm = float(np.linalg.norm(expected))
    diff = float(np.linalg.norm(actual.astype(np.float64) - expected))
    return diff / norm if norm else diff


def _oracle_name(cell: Cell, kind: str) -> str:
    if kind == "bf16-operands":
        return "oracle: numpy_ref.chunked in float64 with bf16 operands"
    if cell.op == "chunked":
        return "oracle: numpy_ref.recurrent in float64, state rounded every chunk"
    return f"oracle: numpy_ref.{cell.op} in float64"


def check(cell: Cell, backend, inputs: dict, outputs: dict):
    """Compare a backend's outputs with the oracle of its rounding model (see module docstring)."""
    model = getattr(backend, "rounding_model", "exact")
    kind = oracle_kind(cell, model)
    expected = oracle(cell, inputs, kind)
    source = f"{_oracle_name(cell, kind)}; backend rounding model {model}"
    if cell.op == "gating":
        comps = [compare(n, outputs[n], expected[n], GATING_TOL) for n in ("g", "beta")]
        return verdict(comps, {"oracle": source})
    missing = {"o", "state"} - set(outputs)
    if missing:
        raise ValueError(f"outputs: missing {sorted(missing)} for gdn/{cell.op}")
    o_tol, s_tol = _tolerances(cell, inputs, expected, model)
    rows = _real_rows(cell, inputs)
    written = _written_slots(cell, inputs)
    untouched = np.setdiff1d(np.arange(inputs["state"].shape[0]), written)
    pool_in = _f32(inputs["state"])
    comps: list[Comparison] = [
        compare("o", outputs["o"][rows], expected["o"][rows], o_tol),
        compare("state", outputs["state"][written], expected["state"][written], s_tol),
        compare("untouched_slots", outputs["state"][untouched], pool_in[untouched],
                Tolerance(0.0, 0.0, "slots no sequence writes must be bit-identical")),
    ]
    same_as_truth = inputs["state_dtype"] == "float32" and kind == "exact"
    truth = expected if same_as_truth else oracle(cell, inputs, "exact", truth=True)
    quality = {
        "oracle": source,
        "o_rel_l2_vs_fp32_state": _rel_l2(outputs["o"][rows], truth["o"][rows]),
        "state_rel_l2_vs_fp32_state": _rel_l2(outputs["state"][written], truth["state"][written]),
    }
    return verdict(comps, quality)
