"""The TurboQuant family: store, decode and store+decode over the quantized KV cache.

Ops: ``store`` (quantize K/V into the cache), ``decode`` (attention of one query token per sequence
over the cache), ``store_decode`` (store this step's token, then decode including it).

Input dict (``make_inputs``; every float array is float32 holding bf16-representable values):
    preset          str, e.g. "turboquant_4bit_nc"
    layout          "aos" or "soa"
    rotation        float32 [D, D], R of reference.turboquant.rotation (y = x_hat @ R, q_rot = q @ R);
                    None for FP8 keys (turboquant_k8v4)
    kv_cache        uint8 [num_blocks, block_size, Hk, slot_size]. store: 0x5A everywhere (bytes the
                    op does not own must stay so). decode: random bytes, then the reference store of
                    every token. store_decode: as decode, minus each sequence's last token
    store, store_decode:
    key, value      [N, Hk, D]; slot_mapping int64 [N] (flat slot block * block_size + offset,
                    distinct, some -1 = skip)
    decode, store_decode:
    query           [B, Hq, D]; block_table int32 [B, M] (non-identity physical blocks, at least
                    two more columns than needed, filled with other valid block ids);
                    seq_lens int32 [B] (unequal, not multiples of the block size); scale float
                    (1/sqrt(D)); sinks None or float32 [Hq] (raw logits)
    key_cache, value_cache   the same tokens unquantized, float32 [num_blocks, block_size, Hk, D],
                    NaN where no token lives (for torch-sdpa and the quantization-error oracle)

Outputs: ``{"kv_cache": uint8 cache}`` (store ops), ``{"out": float32 [B, Hq, D]}`` (decode ops).

Rounding models (``Backend.rounding_model``), each an oracle plus a tolerance; every decode
oracle is float64 attention over the dequantized cache (``reference.turboquant.numpy_ref``'s
``read_fields``/``dequantize_fields``, rotated space, ``q_rot = q @ R``):
    "exact"      fp32 math on the dequantized cache (the references, fp32 kernels).
    "bf16-mma"   kernels with bf16 MMA operands: the oracle rounds q_rot, dequantized K and V to
                 bf16; the kernel's bf16 P and fp32 accumulation (and a bf16 output) are covered by
                 the tolerance.
    "bf16-sdpa"  torch-sdpa: it never reads the TQ cache; its oracle is float64 attention over the
                 UNQUANTIZED key_cache/value_cache (bf16 values), tolerance for bf16 scores, bf16 P
                 and a bf16 output.
Decode cells also report, in ``Verdict.quality``, dequantized vs unquantized attention (the
quantization error of the preset) with its own, looser bound (``quant_bound``).

Store checks compare the cache field by field (see ``STORE_CODES`` and friends): bytes no written
(slot, head) owns must be untouched; codes may flip to the adjacent bucket on a tiny fraction of
elements (a kernel's rotation GEMM or division rounds differently from the reference's, which can
move a value across a decision boundary); fp16 scalars within 1 ulp (the fp32 norm or scale they
round may differ in its last bit, moving the fp16 rounding by one step). Where such a key-code flip
happened in an SoA norm-corrected slot, the expected k_norm is the one folded with the stored codes.
"""
from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from conformance.cells import Cell, make_cell
from conformance.covering import pairwise
from conformance.compare import EXACT, Comparison, Tolerance, compare, verdict
from conformance.poison import INT_SENTINEL
from reference.turboquant import layout as tq_layout
from reference.turboquant import numpy_ref, rotation
from reference.turboquant.presets import preset as lookup

FAMILY = "turboquant"
OPS = ("store", "decode", "store_decode")

PRESET_NAMES = ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "turboquant_k8v4")
HEAD_GROUPS = ((8, 8), (8, 16), (4, 6), (2, 4), (8, 1))  # (Hk, G)
U32 = 2.0**-24  # unit roundoff, fp32
UBF16 = 2.0**-8  # unit roundoff, bf16

STORE_CODES = Tolerance(0.0, 0.0, "codes bit-exact, except that a code whose quantizer input lies "
                        "within its rounding-error bound of a decision boundary (a tie) may move to the "
                        "adjacent bucket: keys |y - midpoint| <= (2D + 8) u32 sum_i |x_hat_i R_ij|; values "
                        "|t - (k + 1/2)| <= 8 u32 (t + 1), t = (v - vmin) / scale")
STORE_FP16 = Tolerance(1.0, 0.0, "fp16 scalars within 1 ulp (ordinal distance): the fp32 norm/scale "
                       "they round may differ in its last bit")

# Relative MSE of the key and value quantizers for a Gaussian vector, D=128: MSE keys, Lloyd-Max
# distortion per unit vector (research/turboquant.md 1.4); FP8 E4M3 keys, u^2/3 with u = 2^-4;
# b-bit uniform values over a range of ~5.2 sigma, (5.2 / (2^b - 1))^2 / 12.
_KEY_DISTORTION = {"turboquant_4bit_nc": 0.0095, "turboquant_k3v4_nc": 0.0345,
                   "turboquant_3bit_nc": 0.0345, "turboquant_k8v4": 2.0**-8 / 3}
_VALUE_DISTORTION = {4: (5.2 / 15) ** 2 / 12, 3: (5.2 / 7) ** 2 / 12}


def quant_bound(preset: str) -> float:
    """Looser bound on rel_l2(dequantized attention - unquantized attention): three times the
    first-order estimate sqrt(Dk * var(score) + Dv) with var(score) = 1 (unit-variance logits of
    N(0,1) q and k at scale 1/sqrt(D))."""
    vb = lookup(preset).value_bits
    return 3.0 * float(np.sqrt(_KEY_DISTORTION[preset] + _VALUE_DISTORTION[vb]))


# ---- the matrix ----------------------------------------------------------------------------

def seq_lens_for(num_seqs: int, max_len: int, mix: str) -> tuple[int, ...]:
    """Deterministic lengths: all ``max_len`` ("equal"), or a cycle of max_len, about half,
    1 and about three quarters ("unequal")."""
    if mix == "equal" or num_seqs == 1:
        return (max_len,) * num_seqs
    pattern = (max_len, max(1, max_len // 2 - 3), 1, max(1, (3 * max_len) // 4 + 1))
    return tuple(pattern[i % 4] for i in range(num_seqs))


def _decode_cell(op, preset, layout, hk_g, bs, lens, rotation, sinks, D=128, seed=0) -> Cell:
    if preset == "turboquant_k8v4":
        rotation = "none"
    Hk, G = hk_g
    return make_cell(FAMILY, op, preset=preset, layout=layout, Hk=Hk, G=G, bs=bs, lens=tuple(lens),
                     rotation=rotation, sinks=sinks, D=D, seed=seed)


def _store_cell(preset, layout, Hk, bs, ntok, rotation, D=128, seed=0) -> Cell:
    if preset == "turboquant_k8v4":
        rotation = "none"
    return make_cell(FAMILY, "store", preset=preset, layout=layout, Hk=Hk, bs=bs, ntok=ntok,
                     rotation=rotation, D=D, seed=seed)


def _tier_axes(tier: str) -> tuple[dict, dict]:
    common = {"preset": list(PRESET_NAMES), "layout": ["aos", "soa"]}
    if tier == "full":
        lens, seqs, ntok = [1, 17, 256, 1024, 4096], [1, 4, 16], [1, 17, 256, 1024, 4096]
    else:
        lens, seqs, ntok = [1, 17, 48], [1, 4], [1, 17, 64]
    store = {**common, "Hk": [8, 4, 2], "bs": [16, 32, 64], "ntok": ntok, "rotation": ["hadamard", "random"]}
    decode = {**common, "hk_g": list(HEAD_GROUPS), "bs": [16, 32, 64], "num_seqs": seqs, "max_len": lens,
              "mix": ["equal", "unequal"], "rotation": ["hadamard", "random"], "sinks": [False, True]}
    return store, decode


def _valid_decode(combo: dict) -> bool:
    return not (combo.get("num_seqs") == 1 and combo.get("mix") == "unequal")


def _corners(tier: str) -> list[Cell]:
    """Named corners: the FlyDSL shapes (GQA-6 MiniMax, GQA-8/16 Qwen), block edges, D=64, and in
    the full tier the upstream FlyDSL test matrix (54 cells)."""
    out = [
        _decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 16, (33, 16, 1, 32), "hadamard", False),
        _decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 32, (31, 32, 33), "random", False),
        _decode_cell("decode", "turboquant_4bit_nc", "aos", (8, 16), 16, (15, 16, 17), "random", True),
        _decode_cell("store_decode", "turboquant_3bit_nc", "soa", (4, 6), 64, (63, 64, 65), "random", True),
        _decode_cell("decode", "turboquant_k3v4_nc", "aos", (2, 4), 16, (40, 9), "random", False, D=64),
        _store_cell("turboquant_4bit_nc", "soa", 4, 16, 40, "random", D=64),
    ]
    if tier == "ci":
        out.append(_decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 16, (256,), "hadamard", False))
        # FlyDSL-kernel shapes past one 64-token partition: G=16 with block 32, G=6 with block 32
        out.append(_decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 16), 32, (130, 64), "hadamard", False))
        out.append(_decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 32, (100, 7), "random", False))
    if tier == "full":
        for n in (1, 4, 16):
            for L in (256, 1024, 4096):
                for hk_g in ((8, 8), (8, 16), (4, 6)):
                    for bs in (16, 32):
                        out.append(_decode_cell("decode", "turboquant_4bit_nc", "soa", hk_g, bs, (L,) * n,
                                                "hadamard", False))
    return out


def _smoke() -> list[Cell]:
    return [
        _store_cell("turboquant_4bit_nc", "aos", 4, 16, 17, "hadamard"),
        _store_cell("turboquant_3bit_nc", "soa", 2, 32, 17, "random"),
        _decode_cell("decode", "turboquant_4bit_nc", "aos", (8, 8), 16, (17, 5), "hadamard", False),
        _decode_cell("decode", "turboquant_k3v4_nc", "soa", (4, 6), 16, (20, 1, 33), "random", True),
        _decode_cell("store_decode", "turboquant_k8v4", "aos", (2, 4), 32, (9, 40), "none", False),
        _decode_cell("store_decode", "turboquant_4bit_nc", "soa", (8, 1), 16, (16, 17), "random", True),
    ]


@lru_cache(maxsize=None)
def _cells(tier: str) -> tuple[Cell, ...]:
    if tier == "smoke":
        return tuple(_smoke())
    if tier not in ("ci", "full"):
        raise ValueError(f"tier must be smoke, ci or full, got {tier!r}")
    store_axes, decode_axes = _tier_axes(tier)
    out = [_store_cell(**row) for row in pairwise(store_axes)]
    for op in ("decode", "store_decode"):
        for row in pairwise(decode_axes, _valid_decode):
            lens = seq_lens_for(row.pop("num_seqs"), row.pop("max_len"), row.pop("mix"))
            out.append(_decode_cell(op, lens=lens, **row))
    out += _corners(tier)
    unique = dict.fromkeys(out)  # k8v4 rows collapse onto rotation=none; keep the first
    return tuple(unique)


def cells(tier: str) -> list[Cell]:
    """The cells of ``tier`` in a deterministic order (store, decode, store_decode, corners)."""
    return list(_cells(tier))


# ---- inputs --------------------------------------------------------------------------------

def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _rotation(cell: Cell):
    if cell["rotation"] == "none":
        return None
    if cell["rotation"] == "hadamard":
        return rotation.hadamard(cell["D"])
    return rotation.random_rotation(cell["D"], seed=1000 + cell.seed)


def _kv(rng, n: int, Hk: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys with per-(token, head) norms spread over a decade, values with offsets and spreads."""
    key = rng.standard_normal((n, Hk, D)) * np.exp(rng.uniform(-1.0, 1.0, (n, Hk, 1)))
    value = rng.standard_normal((n, Hk, D)) * rng.uniform(0.5, 2.0, (n, Hk, 1)) + rng.uniform(-1, 1, (n, Hk, 1))
    return _bf16(key), _bf16(value)


def _store_inputs(cell: Cell, rng) -> dict:
    p, D, Hk, bs, N = lookup(cell["preset"]), cell["D"], cell["Hk"], cell["bs"], cell["ntok"]
    num_blocks = -(-(3 * N) // (2 * bs)) + 2
    slots = rng.permutation(num_blocks * bs)[:N].astype(np.int64)
    slots[rng.permutation(N)[: N // 8]] = -1  # about one in eight tokens is padding
    key, value = _kv(rng, N, Hk, D)
    cache = np.full((num_blocks, bs, Hk, p.slot_size(D)), INT_SENTINEL, dtype=np.uint8)
    return {"preset": p.name, "layout": cell["layout"], "rotation": _rotation(cell), "kv_cache": cache,
            "key": key, "value": value, "slot_mapping": slots}


def _decode_inputs(cell: Cell, rng) -> dict:
    p, D, Hk, G, bs = lookup(cell["preset"]), cell["D"], cell["Hk"], cell["G"], cell["bs"]
    lens = np.array(cell["lens"], dtype=np.int32)
    B, Hq = len(lens), Hk * G
    need = [-(-int(L) // bs) for L in lens]
    num_blocks = sum(need) + 3
    physical = rng.permutation(num_blocks)
    table = rng.integers(0, num_blocks, (B, max(need) + 2)).astype(np.int32)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = physical[start:start + n]
        start += n
    slots = np.concatenate([table[b, np.arange(L) // bs] * bs + np.arange(L) % bs for b, L in enumerate(lens)])
    key, value = _kv(rng, len(slots), Hk, D)
    key_cache = np.full((num_blocks * bs, Hk, D), np.nan, dtype=np.float32)
    value_cache = key_cache.copy()
    key_cache[slots], value_cache[slots] = key, value
    rotation = _rotation(cell)
    cache = rng.integers(0, 256, (num_blocks, bs, Hk, p.slot_size(D)), dtype=np.uint8)
    inputs = {"preset": p.name, "layout": cell["layout"], "rotation": rotation,
              "query": _bf16(rng.standard_normal((B, Hq, D))), "block_table": table, "seq_lens": lens,
              "scale": float(1.0 / np.sqrt(D)),
              "sinks": rng.uniform(-2.0, 4.0, Hq).astype(np.float32) if cell["sinks"] else None,
              "key_cache": key_cache.reshape(num_blocks, bs, Hk, D),
              "value_cache": value_cache.reshape(num_blocks, bs, Hk, D)}
    if cell.op == "store_decode":  # the last token of each sequence is this step's, stored by the op
        last = np.cumsum(lens) - 1
        history = np.setdiff1d(np.arange(len(slots)), last)
        numpy_ref.store(cache, key[history], value[history], slots[history], p.name, cell["layout"], rotation)
        pad_key, pad_value = _kv(rng, 2, Hk, D)
        inputs.update(key=np.concatenate([pad_key[:1], key[last], pad_key[1:]]),
                      value=np.concatenate([pad_value[:1], value[last], pad_value[1:]]),
                      slot_mapping=np.concatenate([[-1], slots[last], [-1]]).astype(np.int64))
    else:
        numpy_ref.store(cache, key, value, slots, p.name, cell["layout"], rotation)
    inputs["kv_cache"] = cache
    return inputs


def make_inputs(cell: Cell) -> dict:
    """The cell's inputs (keys in the module docstring), drawn from ``cell.rng()``."""
    rng = cell.rng()
    return _store_inputs(cell, rng) if cell.op == "store" else _decode_inputs(cell, rng)


def run_with(impl, cell: Cell, inputs: dict) -> dict:
    """Run the cell's op through ``impl`` (a module or object with the reference's ``store`` and
    ``decode``). ``store`` may write the cache in place (NumPy) or return the new one (JAX)."""
    out = {}
    cache = inputs["kv_cache"]
    common = (inputs["preset"], inputs["layout"], inputs["rotation"])
    if cell.op in ("store", "store_decode"):
        result = impl.store(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], *common)
        cache = cache if result is None else result
        out["kv_cache"] = np.asarray(cache)
    if cell.op in ("decode", "store_decode"):
        o = impl.decode(inputs["query"], cache, inputs["block_table"], inputs["seq_lens"], *common,
                        scale=inputs["scale"], sinks=inputs["sinks"])
        out["out"] = np.asarray(o, dtype=np.float32)
    return out


# ---- oracles -------------------------------------------------------------------------------

_MEMO: dict = {}


def _memo(key, compute):
    """Per-cell oracle cache (a few entries: the runner checks one cell on several backends)."""
    if key not in _MEMO:
        if len(_MEMO) >= 8:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = compute()
    return _MEMO[key]


def _cached(cell: Cell, what: str, compute):
    """Memoised for decode cells; store_decode oracles depend on the backend's cache: recomputed."""
    return _memo((cell, what), compute) if cell.op == "decode" else compute()


def _expected_cache(cell: Cell, inputs: dict) -> np.ndarray:
    def compute():
        cache = inputs["kv_cache"].copy()
        numpy_ref.store(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], inputs["preset"],
                        inputs["layout"], inputs["rotation"])
        return cache

    return _memo((cell, "cache"), compute)


def _fp16_ordinal(x: np.ndarray) -> np.ndarray:
    """fp16 bit patterns mapped to integers in value order (adjacent floats differ by 1)."""
    bits = np.asarray(x, dtype=np.float16).view(np.int16).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


def _check_store(cell: Cell, inputs: dict, actual) -> list:
    from reference.turboquant import layout as tq_layout, numpy_ref
    expected = _expected_cache(cell, inputs)
    actual = np.asarray(actual)
    if actual.shape != expected.shape or actual.dtype != np.uint8:
        return [Comparison("kv_cache", False, f"kv_cache: {actual.dtype} {list(actual.shape)}, expected "
                           f"uint8 {list(expected.shape)}", {"max_abs": float("inf")}, EXACT)]
    p, lay = lookup(inputs["preset"]), inputs["layout"]
    _, bs, Hk, _ = expected.shape
    D = inputs["key"].shape[-1]
    slots = inputs["slot_mapping"][inputs["slot_mapping"] >= 0]
    owned = np.zeros(expected.size, dtype=bool)
    offs = tq_layout.field_offsets(p, D, Hk, bs, lay, slots[:, None], np.arange(Hk))
    for name, n in tq_layout.field_sizes(p, D).items():
        owned[tq_layout.byte_indices(offs[name], n)] = True
    got = numpy_ref.read_fields(actual, slots, p, lay, D)
    want = numpy_ref.read_fields(expected, slots, p, lay, D)
    ties = _ties(inputs, p)
    out = [compare("untouched_bytes", actual.reshape(-1)[~owned], expected.reshape(-1)[~owned], EXACT)]
    for name in ("key_codes", "value_codes"):
        g, w = got[name].astype(np.int64), want[name].astype(np.int64)
        forgiven = ties[name] & (np.abs(g - w) == 1)
        out.append(compare(name, np.where(forgiven, w, g), w, STORE_CODES))
    if p.norm_correction and lay == "soa" and "k_norm" in want:
        # the SoA store folds sum(c[idx]^2) into k_norm: a forgiven key-code flip changes it
        flipped = np.any(got["key_codes"] != want["key_codes"], axis=-1)
        want = {**want, "k_norm": np.where(flipped, _folded_norm(inputs, got["key_codes"], p), want["k_norm"])}
    for name in ("k_norm", "v_scale", "v_zero"):
        if name in want:
            out.append(compare(name, _fp16_ordinal(got[name]), _fp16_ordinal(want[name]), STORE_FP16))
    return out


def _folded_norm(inputs: dict, key_codes: np.ndarray, p) -> np.ndarray:
    """fp16 ``||k|| / sqrt(sum_j c[idx_j]^2 + 1e-16)`` (float64) of the stored keys for the given
    codes ``[n, Hk, D]``: what an SoA norm-corrected store writes for those codes."""
    k = inputs["key"][inputs["slot_mapping"] >= 0].astype(np.float64)
    c = numpy_ref.centroids(p.key_bits, k.shape[-1]).astype(np.float64)[key_codes]
    return (np.linalg.norm(k, axis=-1) / np.sqrt(np.sum(c * c, axis=-1) + 1e-16)).astype(np.float16)


def _ties(inputs: dict, p) -> dict[str, np.ndarray]:
    """Masks ``[n, Hk, D]`` of the stored (slot >= 0) elements whose quantizer input is within its
    fp32 rounding-error bound of a decision boundary (``STORE_CODES``), computed in float64."""
    keep = inputs["slot_mapping"] >= 0
    k = inputs["key"][keep].astype(np.float64)
    v = inputs["value"][keep].astype(np.float64)
    D = k.shape[-1]
    if p.key_fp8:
        key_ties = np.zeros(k.shape, dtype=bool)
    else:
        R = np.asarray(inputs["rotation"], np.float64)
        x = k / (np.linalg.norm(k, axis=-1, keepdims=True) + 1e-8)
        y = x @ R
        mids = numpy_ref.midpoints(numpy_ref.centroids(p.key_bits, D)).astype(np.float64)
        dist = np.min(np.abs(y[..., None] - mids), axis=-1)
        key_ties = dist <= (2 * D + 8) * U32 * (np.abs(x) @ np.abs(R))
    top = 2**p.value_bits - 1
    vmin = np.clip(v.min(axis=-1, keepdims=True), -65504, 65504).astype(np.float32).astype(np.float64)
    vmax = np.clip(v.max(axis=-1, keepdims=True), -65504, 65504).astype(np.float32).astype(np.float64)
    scale = np.maximum(np.float32((vmax - vmin) / top), np.float32(1e-8)).astype(np.float64)
    t = (v - vmin) / scale
    value_ties = np.abs(t - (np.floor(t) + 0.5)) <= 8 * U32 * (t + 1)
    return {"key_codes": key_ties, "value_codes": value_ties}


def _attention64(q, keys, values, G: int, scale: float, sinks) -> np.ndarray:
    """float64 softmax attention: q [B, Hq, D]; keys/values lists of [L_b, Hk, D]."""
    out = np.empty(q.shape, dtype=np.float64)
    for b, (k, v) in enumerate(zip(keys, values)):
        k = np.repeat(np.asarray(k, np.float64), G, axis=1)
        v = np.repeat(np.asarray(v, np.float64), G, axis=1)
        x = scale * np.einsum("hd,thd->ht", q[b], k)
        m = x.max(axis=1)
        if sinks is not None:
            m = np.maximum(m, sinks)
        e = np.exp(x - m[:, None])
        denom = e.sum(axis=1) + (np.exp(sinks - m) if sinks is not None else 0.0)
        out[b] = np.einsum("ht,thd->hd", e, v) / denom[:, None]
    return out


def _dequantized(inputs: dict, cache) -> tuple[list, list]:
    """Rotated-space keys and values per sequence, float32, from ``cache``."""
    return numpy_ref.dequantize(cache, inputs["block_table"], inputs["seq_lens"], inputs["preset"],
                                inputs["layout"], inputs["rotation"], rotated=True)


def _unquantized(inputs: dict) -> tuple[list, list]:
    bt, lens = inputs["block_table"], inputs["seq_lens"]
    _, bs, Hk, D = inputs["key_cache"].shape
    kc, vc = inputs["key_cache"].reshape(-1, Hk, D), inputs["value_cache"].reshape(-1, Hk, D)
    slots = [bt[b, np.arange(L) // bs] * bs + np.arange(L) % bs for b, L in enumerate(lens)]
    return [kc[s] for s in slots], [vc[s] for s in slots]


def _exact_atol(q_rot, keys, values, G, scale, L_max) -> tuple[float, float, float]:
    """(atol, max|V|, max|x|) of fp32 attention against float64, by the probabilistic rounding-error
    bound (Higham and Mary 2019: a length-n fp32 sum of products is off by at most
    lambda sqrt(n) u32 sum|terms| with overwhelming probability; lambda = 8 here): each logit is off
    by e_x = lambda sqrt(2(D+1)) u32 scale max_t sum_i |q_i k_ti| (the q rotation, then the dot),
    which moves the softmax weights by 2 e_x relative; the softmax sums and PV add
    lambda sqrt(L + D) u32 relative. So |out error| <= max|V| (2 e_x + lambda sqrt(L + D) u32)."""
    lam, D = 8.0, q_rot.shape[-1]
    xmax = vmax = 0.0
    for b, (k, v) in enumerate(zip(keys, values)):
        k = np.repeat(np.abs(np.asarray(k, np.float64)), G, axis=1)
        xmax = max(xmax, float((scale * np.einsum("hd,thd->ht", np.abs(q_rot[b]), k)).max()))
        vmax = max(vmax, float(np.abs(v).max()))
    ex = lam * np.sqrt(2 * (D + 1)) * U32 * xmax
    return vmax * (2 * ex + lam * np.sqrt(L_max + D) * U32), vmax, xmax


def _oracle(model: str, inputs: dict, cache, G: int):
    """(expected output, Tolerance) of a decode for ``model``."""
    q = inputs["query"].astype(np.float64)
    scale, sinks = inputs["scale"], inputs["sinks"]
    sinks = None if sinks is None else np.asarray(sinks, np.float64)
    L_max = int(np.max(inputs["seq_lens"]))
    if model == "bf16-sdpa":
        keys, values = _unquantized(inputs)
        atol, vmax, xmax = _exact_atol(q, keys, values, G, scale, L_max)
        tol = Tolerance(atol + vmax * UBF16 * (1 + 2 * xmax), 2 * UBF16,
                        "bf16 SDPA vs float64 over the unquantized bf16 cache: logits rounded to bf16 "
                        "(|dx| <= u_bf16 |x|, weights off by 2 u_bf16 max|x| relative), P rounded to "
                        "bf16 (u_bf16 max|V|), output rounded to bf16 and its normaliser (2 u_bf16 relative), "
                        "plus the fp32 accumulation bound")
        return _attention64(q, keys, values, G, scale, sinks), tol
    keys, values = _dequantized(inputs, cache)
    R = inputs["rotation"]
    q_rot = q if lookup(inputs["preset"]).key_fp8 else q @ np.asarray(R, np.float64)
    atol, vmax, _ = _exact_atol(q_rot, keys, values, G, scale, L_max)
    if model == "exact":
        tol = Tolerance(atol, 0.0, "fp32 attention vs float64 on the same dequantized cache: "
                        "|err| <= max|V| (2 e_x + 8 sqrt(L + D) u32), e_x = 8 sqrt(2 (D+1)) u32 scale max "
                        "sum |q_rot k| (probabilistic rounding-error bound, lambda = 8)")
        return _attention64(q_rot, keys, values, G, scale, sinks), tol
    if model == "bf16-mma":
        q_rot = _bf16(inputs["query"] if lookup(inputs["preset"]).key_fp8
                      else inputs["query"].astype(np.float32) @ np.asarray(R, np.float32)).astype(np.float64)
        keys, values = [_bf16(k) for k in keys], [_bf16(v) for v in values]
        tol = Tolerance(atol + vmax * UBF16, 2 * UBF16,
                        "bf16 MMA operands: oracle rounds q_rot, dequantized K and V to bf16; the kernel's "
                        "bf16 P adds u_bf16 max|V|, a bf16 output and normaliser 2 u_bf16 relative, "
                        "plus the fp32 accumulation bound")
        return _attention64(q_rot, keys, values, G, scale, sinks), tol
    raise ValueError(f"unknown rounding model {model!r} for turboquant (exact, bf16-mma, bf16-sdpa)")


def _quality(cell: Cell, inputs: dict, cache, G: int) -> dict:
    """Dequantized vs unquantized float64 attention: the preset's quantization error."""
    def compute():
        q = inputs["query"].astype(np.float64)
        sinks = None if inputs["sinks"] is None else np.asarray(inputs["sinks"], np.float64)
        keys, values = _dequantized(inputs, cache)
        R = inputs["rotation"]
        q_rot = q if lookup(inputs["preset"]).key_fp8 else q @ np.asarray(R, np.float64)
        deq = _attention64(q_rot, keys, values, G, inputs["scale"], sinks)
        uk, uv = _unquantized(inputs)
        ref = _attention64(q, uk, uv, G, inputs["scale"], sinks)
        bound = quant_bound(inputs["preset"])
        c = compare("quant_error", deq, ref, Tolerance(float("inf"), 0.0, "quantization error, reported "
                    "(3x the first-order estimate, see quant_bound)", rel_l2=bound))
        return {"quant_error": c.metrics, "quant_bound_rel_l2": bound, "quant_within_bound": c.passed}

    return _cached(cell, "quality", compute)


def check(cell: Cell, backend, inputs: dict, outputs: dict):
    """Store ops: the cache field by field against the NumPy reference store. Decode ops: the
    output against the oracle of ``backend.rounding_model`` (module docstring); quality reports
    the quantization error (not for torch-sdpa, which never reads the quantized cache)."""
    comparisons, quality = [], {}
    model = backend.rounding_model
    cache = inputs["kv_cache"]
    if cell.op in ("store", "store_decode"):
        comparisons += _check_store(cell, inputs, outputs["kv_cache"])
        cache = np.asarray(outputs["kv_cache"])  # the decode is judged on the backend's own store
    if cell.op in ("decode", "store_decode"):
        G = cell["G"]
        expected, tol = _cached(cell, model, lambda: _oracle(model, inputs, cache, G))
        comparisons.append(compare("out", outputs["out"], expected, tol))
        if model != "bf16-sdpa":
            quality = _quality(cell, inputs, cache, G)
    return verdict(comparisons, quality)
