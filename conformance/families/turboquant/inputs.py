"""TurboQuant inputs: the input dict of a cell, drawn from ``cell.rng()``.

query, key and value are arrays OF the cell's activation dtype (``cells.activation``: ml_dtypes.bfloat16,
float16 or float32, drawn in float64 then rounded by ``numerics.to_activation``); every other float
array is float32:
    preset          str, e.g. "turboquant_4bit_nc"
    layout          "aos" or "soa"
    rotation        float32 [D, D], R of reference.turboquant.rotation (y = x_hat @ R, q_rot = q @ R);
                    None for FP8 keys (turboquant_k8v4)
    kv_cache        uint8 [num_blocks, block_size, Hk, slot_size]. store: 0x5A everywhere (bytes the
                    op does not own must stay so). decode: random bytes, then the reference store of
                    every token. store_decode: as decode, minus each sequence's last token
    store, store_decode:
    key, value      act [N, Hk, D]; slot_mapping int64 [N] (flat slot block * block_size + offset,
                    distinct, some -1 = skip)
    decode, store_decode:
    query           act [B, Hq, D]; block_table int32 [B, M] (non-identity physical blocks, at least
                    two more columns than needed, filled with other valid block ids);
                    seq_lens int32 [B] (unequal, not multiples of the block size); scale float
                    (1/sqrt(D)); sinks None or float32 [Hq] (raw logits)
    pool            (big-pool cells) the cache's slot count, past 2^16: half the blocks used lie past slot
                    65535 (``high_first``); the reference computes slots in int64
    key_cache, value_cache   the same tokens unquantized, float32 [num_blocks, block_size, Hk, D] holding
                    the act values, NaN where no token lives (for torch-sdpa and the quantization-error oracle)

Magnitudes (the cell's ``range``, ``RANGES``; cells without one mean "unit"): "unit" keys N(0, 1) with per-(token, head) norms spread
over a decade, values N(0, 1) scaled by 0.5 to 2 plus an offset in [-1, 1], queries N(0, 1); "wide" the
keys times 200 (entries in the hundreds: ||k||^2 overflows float16), the values times 3000 (v_zero near
-2^15, v_scale near 2^12) and the queries over 2000 (about 1e-3, the smallest float16 subnormals),
so the logits are a tenth of the "unit" ones; "small-q" the queries times 0.01: nearly flat softmax weights (logits within
about 0.2), so the output shows the rounding of V itself.

Adversarial draws (the cell's ``pattern``, ``PATTERNS``; cells without one mean "iid", the draws above), each with
unit-range magnitudes unless said:
- "near-duplicate": every key of a kv head is one base key times (1 + 2^-12 noise), so most rows are equal in the
  activation dtype (softmax ties: the output is about the mean of V); the base key is built in the rotated space with
  half its coordinates on the quantizer's decision boundaries (quantization ties, forgiven by ``STORE_CODES``).
- "correlated": keys 0.95 of a shared per-head direction plus 0.3 of independent noise (logits close together).
- "dtype-edge": queries N(0, 10^4^2) (entries up to about 4e4, near float16's 65504), keys of norm about 1e-3 (entries
  partly float16 subnormals), so the logits stay about 1; values up to +-6e4 (v_zero and 15 v_scale near float16's
  range, the bound of the cache's fp16 scalars: beyond it the reference clamps); FP8 keys that small flush to zero
  (flat weights, a large quantization error, reported).
- "norm-edge": key norms 0.5 to 0.9 of 65504, just inside the fp16 k_norm field (the SoA store's folded norm stays
  below it too), queries 2e-4 N(0, 1) so the logits stay about 1.
- "aligned": each query head is a multiple of one key of its kv head (the sequence's last token for even heads,
  a drawn one for odd heads) with that logit 20: a peaked softmax whose output is about that token's V.
- "logit-edge": as "aligned" with that logit 150, past 88.7 where exp overflows float32. The reference
  subtracts each head's largest logit (sinks included) before exp, so every weight is exp(x - max) <= 1;
  a softmax that takes exp(x) unshifted gets inf / inf.
"""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell, activation
from conformance.numerics import to_activation
from conformance.poison import INT_SENTINEL
from reference.turboquant import numpy_ref, rotation
from reference.turboquant.presets import preset as lookup


def token_slots(block_table: np.ndarray, seq_lens, bs: int) -> list[np.ndarray]:
    """Flat cache slots (block * bs + offset) of every token, one array per sequence."""
    return [block_table[b, np.arange(L) // bs] * bs + np.arange(L) % bs for b, L in enumerate(seq_lens)]


def rotation_of(cell: Cell):
    """R [D, D] float32 of the cell (None for FP8 keys)."""
    if cell["rotation"] == "none":
        return None
    if cell["rotation"] == "hadamard":
        return rotation.hadamard(cell["D"])
    return rotation.random_rotation(cell["D"], seed=1000 + cell.seed)


# range -> (key, value, query) multipliers
RANGES = {"unit": (1.0, 1.0, 1.0), "wide": (200.0, 3000.0, 1.0 / 2000.0), "small-q": (1.0, 1.0, 0.01)}
PATTERNS = ("iid", "near-duplicate", "correlated", "dtype-edge", "norm-edge", "aligned", "logit-edge")
FP16_MAX = 65504.0
ALIGNED_LOGIT = {"aligned": 20.0, "logit-edge": 150.0}   # the aligned key's logit


def pattern_of(cell: Cell) -> str:
    """The cell's adversarial draw (``PATTERNS``; "iid" when it has none)."""
    name = cell.get("pattern", "iid")
    if name not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {name!r}")
    return name


def _tied_direction(rng, Hk: int, D: int, cell: Cell, R) -> np.ndarray:
    """``[Hk, D]`` unit keys whose rotated coordinates ``x @ R`` sit, for half of them, on a decision
    boundary of the preset's quantizer (FP8 keys: a plain Gaussian direction)."""
    y = rng.standard_normal((Hk, D)) / np.sqrt(D)
    p = lookup(cell["preset"])
    if not p.key_fp8:
        mids = numpy_ref.midpoints(numpy_ref.centroids(p.key_bits, D)).astype(np.float64)
        nearest = mids[np.argmin(np.abs(y[..., None] - mids), axis=-1)]
        y = np.where(rng.random((Hk, D)) < 0.5, nearest, y)
        y = y @ np.asarray(R, np.float64).T
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def key_value(rng, n: int, Hk: int, D: int, cell: Cell, R=None) -> tuple[np.ndarray, np.ndarray]:
    """Keys with per-(token, head) norms spread over a decade, values with offsets and spreads, scaled
    by the cell's range, or drawn as its ``pattern`` says (R: the cell's rotation), in its activation dtype."""
    ks, vs, _ = RANGES[cell.get("range", "unit")]
    pattern = pattern_of(cell)
    key = rng.standard_normal((n, Hk, D)) * np.exp(rng.uniform(-1.0, 1.0, (n, Hk, 1)))
    value = rng.standard_normal((n, Hk, D)) * rng.uniform(0.5, 2.0, (n, Hk, 1)) + rng.uniform(-1, 1, (n, Hk, 1))
    if pattern == "near-duplicate":
        base = _tied_direction(rng, Hk, D, cell, R) * np.sqrt(D)
        key = base * (1.0 + 2.0**-12 * rng.standard_normal((n, Hk, D)))
    elif pattern == "correlated":
        shared = rng.standard_normal((1, Hk, D))
        key = 0.95 * shared + 0.3 * rng.standard_normal((n, Hk, D))
    elif pattern == "dtype-edge":
        key = key * 1e-3 / np.sqrt(D)
        value = np.clip(value * 2e4, -6e4, 6e4)
    elif pattern == "norm-edge":
        unit = key / np.linalg.norm(key, axis=-1, keepdims=True)
        key = unit * FP16_MAX * rng.uniform(0.5, 0.9, (n, Hk, 1))
    return to_activation(ks * key, activation(cell)), to_activation(vs * value, activation(cell))


def query_of(rng, cell: Cell, shape: tuple[int, int, int], key: np.ndarray, lens) -> np.ndarray:
    """The query ``[B, Hq, D]`` in the activation dtype: N(0, 1) times the range's multiplier, or as the
    pattern says; ``key [tokens, Hk, D]`` holds the sequences' keys one after another (lengths ``lens``)."""
    pattern = pattern_of(cell)
    z = rng.standard_normal(shape)
    q = {"dtype-edge": 1e4, "norm-edge": 2e-4}.get(pattern, RANGES[cell.get("range", "unit")][2]) * z
    if pattern in ALIGNED_LOGIT:
        B, Hq, D = shape
        G = Hq // key.shape[1]
        start = np.concatenate([[0], np.cumsum(lens)[:-1]])
        scale = 1.0 / np.sqrt(D)
        for b in range(B):
            for hq in range(Hq):
                t = lens[b] - 1 if hq % 2 == 0 else int(rng.integers(0, lens[b]))
                k = key[start[b] + t, hq // G].astype(np.float64)
                q[b, hq] = ALIGNED_LOGIT[pattern] / (scale * float(k @ k)) * k
    return to_activation(q, activation(cell))


SLOTS_16BIT = 1 << 16


def high_first(rng, n: int, count: int, bs: int) -> np.ndarray:
    """``n`` distinct block ids of ``count`` blocks, a random order; in a pool past 2^16 slots, half of them
    (rounded up; at most the blocks there are) hold slots past 65535, which 16-bit slot arithmetic wraps."""
    low = SLOTS_16BIT // bs
    if count <= low:
        return rng.permutation(count)[:n]
    high = low + rng.permutation(count - low)[: n - n // 2]
    return rng.permutation(np.concatenate([high, rng.permutation(low)[: n - len(high)]]))


def store_inputs(cell: Cell, rng) -> dict:
    """A store cell's inputs: the cache filled with the poison byte, about 1 in 8 tokens skipped; a cell's
    ``pool`` (slots) sets the cache's size, half the tokens then stored past slot 65535."""
    p, D, Hk, bs, N = lookup(cell["preset"]), cell["D"], cell["Hk"], cell["bs"], cell["ntok"]
    num_blocks = cell["pool"] // bs if cell.get("pool") else -(-(3 * N) // (2 * bs)) + 2
    if cell.get("pool"):
        blocks = high_first(rng, -(-N // bs) + 1, num_blocks, bs)
        slots = rng.permutation((blocks[:, None] * bs + np.arange(bs)).reshape(-1))[:N].astype(np.int64)
    else:
        slots = rng.permutation(num_blocks * bs)[:N].astype(np.int64)
    slots[rng.permutation(N)[: N // 8]] = -1  # about one in eight tokens is padding
    R = rotation_of(cell)
    key, value = key_value(rng, N, Hk, D, cell, R)
    cache = np.full((num_blocks, bs, Hk, p.slot_size(D)), INT_SENTINEL, dtype=np.uint8)
    return {"preset": p.name, "layout": cell["layout"], "rotation": R, "kv_cache": cache,
            "key": key, "value": value, "slot_mapping": slots}


def decode_inputs(cell: Cell, rng) -> dict:
    """A decode or store_decode cell's inputs (the history stored by the reference store); a cell's ``pool``
    (slots) sets the cache's size, the sequences' blocks drawn half past slot 65535."""
    p, D, Hk, G, bs = lookup(cell["preset"]), cell["D"], cell["Hk"], cell["G"], cell["bs"]
    lens = np.array(cell["lens"], dtype=np.int32)
    B, Hq = len(lens), Hk * G
    need = [-(-int(L) // bs) for L in lens]
    num_blocks = cell["pool"] // bs if cell.get("pool") else sum(need) + 3
    physical = high_first(rng, sum(need), num_blocks, bs)
    table = rng.integers(0, num_blocks, (B, max(need) + 2)).astype(np.int32)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = physical[start:start + n]
        start += n
    slots = np.concatenate(token_slots(table, lens, bs))
    R = rotation_of(cell)
    key, value = key_value(rng, len(slots), Hk, D, cell, R)
    key_cache = np.full((num_blocks * bs, Hk, D), np.nan, dtype=np.float32)
    value_cache = key_cache.copy()
    key_cache[slots], value_cache[slots] = key, value
    cache = rng.integers(0, 256, (num_blocks, bs, Hk, p.slot_size(D)), dtype=np.uint8)
    inputs = {"preset": p.name, "layout": cell["layout"], "rotation": R,
              "query": query_of(rng, cell, (B, Hq, D), key, lens),
              "block_table": table, "seq_lens": lens,
              "scale": float(1.0 / np.sqrt(D)),
              "sinks": rng.uniform(-2.0, 4.0, Hq).astype(np.float32) if cell["sinks"] else None,
              "key_cache": key_cache.reshape(num_blocks, bs, Hk, D),
              "value_cache": value_cache.reshape(num_blocks, bs, Hk, D)}
    if cell.op == "store_decode":  # the last token of each sequence is this step's, stored by the op
        last = np.cumsum(lens) - 1
        history = np.setdiff1d(np.arange(len(slots)), last)
        numpy_ref.store(cache, key[history], value[history], slots[history], p.name, cell["layout"], R)
        pad_key, pad_value = key_value(rng, 2, Hk, D, cell, R)
        inputs.update(key=np.concatenate([pad_key[:1], key[last], pad_key[1:]]),
                      value=np.concatenate([pad_value[:1], value[last], pad_value[1:]]),
                      slot_mapping=np.concatenate([[-1], slots[last], [-1]]).astype(np.int64))
    else:
        numpy_ref.store(cache, key, value, slots, p.name, cell["layout"], R)
    inputs["kv_cache"] = cache
    return inputs


def make_inputs(cell: Cell) -> dict:
    """The cell's inputs (keys in the module docstring), drawn from ``cell.rng()``."""
    rng = cell.rng()
    return store_inputs(cell, rng) if cell.op == "store" else decode_inputs(cell, rng)
