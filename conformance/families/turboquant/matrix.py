"""TurboQuant matrix: the axes of store and decode cells, validity, the named corners and the tiers.

A store cell's params: preset, layout, Hk, bs (block size), ntok, rotation, D, range, act, seed. A
decode or store_decode cell's: preset, layout, Hk, G (query heads per kv head), bs, lens (per sequence),
rotation ("hadamard", "random", "none" for FP8 keys), sinks, D, range, act, seed.

``range`` is the magnitude of the activations (``inputs.RANGES``): "unit", "wide" (keys in the
hundreds, so ||k||^2 overflows float16; values whose v_zero and v_scale reach 2^15 and 2^12; queries
about 1e-3, partly float16 subnormals) or "small-q" (queries times 0.01: flat softmax weights). ``act``
is the activation dtype (``numerics.ACTIVATIONS``) of query, key and value. Both are pairwise axes; the
named corners add the float16 range cases, head size 96 (``non_power_of_two``) and the adversarial draws
(``adversarial``: cells with a ``pattern`` parameter, ``inputs.PATTERNS``, before the seed).

The edge of float32 (``fp32_edge``): the "logit-edge" pattern, each query head's largest logit 150, past 88.7
where exp overflows float32; the reference subtracts the largest logit (sinks included) first.
Big pools (``big_pools``, a ``pool`` parameter): caches of 66000 slots, half the blocks used past slot 65535,
where 16-bit slot arithmetic (block * block_size + offset) wraps; the reference computes slots in int64.
"""
from __future__ import annotations

from functools import lru_cache

from conformance.cells import Cell, make_cell
from conformance.covering import pairwise
from conformance.families.turboquant.inputs import PATTERNS, RANGES
from conformance.numerics import ACTIVATIONS
from reference.turboquant.rotation import is_power_of_two

FAMILY = "turboquant"
OPS = ("store", "decode", "store_decode")

PRESET_NAMES = ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "turboquant_k8v4")
HEAD_GROUPS = ((8, 8), (8, 16), (4, 6), (2, 4), (8, 1))  # (Hk, G)
ACTS = tuple(ACTIVATIONS)


def seq_lens_for(num_seqs: int, max_len: int, mix: str) -> tuple[int, ...]:
    """Deterministic lengths: all ``max_len`` ("equal"), or a cycle of max_len, about half,
    1 and about three quarters ("unequal")."""
    if mix == "equal" or num_seqs == 1:
        return (max_len,) * num_seqs
    pattern = (max_len, max(1, max_len // 2 - 3), 1, max(1, (3 * max_len) // 4 + 1))
    return tuple(pattern[i % 4] for i in range(num_seqs))


def _pattern(pattern) -> dict:
    """The ``pattern`` parameter of an adversarial cell (``inputs.PATTERNS``); none for the iid draws."""
    if pattern is None:
        return {}
    if pattern not in PATTERNS or pattern == "iid":
        raise ValueError(f"pattern must be None or one of {PATTERNS[1:]}, got {pattern!r}")
    return {"pattern": pattern}


def _rotation(preset, rotation, D) -> str:
    """FP8-key presets take rotation "none"; a Hadamard needs a power-of-two D (``reference.turboquant.rotation``)."""
    if preset == "turboquant_k8v4":
        return "none"
    if rotation == "hadamard" and not is_power_of_two(D):
        raise ValueError(f"rotation 'hadamard' needs a power-of-two D, got D={D}: use 'random'")
    return rotation


def decode_cell(op, preset, layout, hk_g, bs, lens, rotation, sinks, D=128, range="unit", act="bfloat16",
                seed=0, pattern=None, pool=None) -> Cell:
    """A decode or store_decode cell; ``hk_g`` = (Hk, G); FP8-key presets get rotation "none";
    ``pattern`` names an adversarial draw (``inputs.PATTERNS``); ``pool``: the cache's slots."""
    Hk, G = hk_g
    return make_cell(FAMILY, op, preset=preset, layout=layout, Hk=Hk, G=G, bs=bs, lens=tuple(lens),
                     rotation=_rotation(preset, rotation, D), sinks=sinks, D=D, range=range, act=act,
                     **_pattern(pattern), **({} if pool is None else {"pool": pool}), seed=seed)


def store_cell(preset, layout, Hk, bs, ntok, rotation, D=128, range="unit", act="bfloat16", seed=0,
               pattern=None, pool=None) -> Cell:
    """A store cell of ``ntok`` tokens; FP8-key presets get rotation "none"; ``pool``: the cache's slots."""
    return make_cell(FAMILY, "store", preset=preset, layout=layout, Hk=Hk, bs=bs, ntok=ntok,
                     rotation=_rotation(preset, rotation, D), D=D, range=range, act=act, **_pattern(pattern),
                     **({} if pool is None else {"pool": pool}), seed=seed)


def axes(tier: str) -> tuple[dict, dict]:
    """(store axes, decode axes) of a tier, in cell-id order."""
    common = {"preset": list(PRESET_NAMES), "layout": ["aos", "soa"]}
    if tier == "full":
        lens, seqs, ntok = [1, 17, 256, 1024, 4096], [1, 4, 16], [1, 17, 256, 1024, 4096]
    else:
        lens, seqs, ntok = [1, 17, 48], [1, 4], [1, 17, 64]
    store = {**common, "Hk": [8, 4, 2], "bs": [16, 32, 64], "ntok": ntok, "rotation": ["hadamard", "random"],
             "range": list(RANGES), "act": list(ACTS)}
    decode = {**common, "hk_g": list(HEAD_GROUPS), "bs": [16, 32, 64], "num_seqs": seqs, "max_len": lens,
              "mix": ["equal", "unequal"], "rotation": ["hadamard", "random"], "sinks": [False, True],
              "range": list(RANGES), "act": list(ACTS)}
    return store, decode


def valid_decode(combo: dict) -> bool:
    """False for one sequence with "unequal" lengths (nothing to be unequal to)."""
    return not (combo.get("num_seqs") == 1 and combo.get("mix") == "unequal")


def corners(tier: str) -> list[Cell]:
    """Named corners: the FlyDSL shapes (GQA-6 MiniMax, GQA-8/16 Qwen), block edges, D=64, D=256, the float16
    range (wide activations in float16), and in the full tier long float16 sequences and the upstream FlyDSL
    test matrix (54 cells, bfloat16 as upstream)."""
    out = [
        decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 16, (33, 16, 1, 32), "hadamard", False),
        decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 32, (31, 32, 33), "random", False),
        decode_cell("decode", "turboquant_4bit_nc", "aos", (8, 16), 16, (15, 16, 17), "random", True),
        decode_cell("store_decode", "turboquant_3bit_nc", "soa", (4, 6), 64, (63, 64, 65), "random", True),
        decode_cell("decode", "turboquant_k3v4_nc", "aos", (2, 4), 16, (40, 9), "random", False, D=64),
        store_cell("turboquant_4bit_nc", "soa", 4, 16, 40, "random", D=64),
        # D=256: Qwen3-Next's full-attention head size (2 KV heads, 16 query heads)
        store_cell("turboquant_4bit_nc", "soa", 2, 16, 9, "hadamard", D=256),
        store_cell("turboquant_k3v4_nc", "aos", 2, 32, 5, "random", D=256),
        decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 8), 16, (33, 17), "hadamard", False, D=256),
        decode_cell("decode", "turboquant_3bit_nc", "aos", (2, 8), 32, (20, 1), "random", True, D=256),
        decode_cell("store_decode", "turboquant_k8v4", "soa", (2, 8), 16, (9, 16), "none", True, D=256),
        # float16 range: ||k||^2 and the unnormalised P V sums overflow float16, queries reach its subnormals
        store_cell("turboquant_4bit_nc", "aos", 8, 16, 33, "hadamard", range="wide", act="float16"),
        decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 16, (200, 33), "hadamard", False, range="wide",
                    act="float16"),
        decode_cell("store_decode", "turboquant_4bit_nc", "soa", (4, 6), 32, (100, 7), "random", True,
                    range="wide", act="float16"),
        # float32 activations on the grouped decode's cache (its fp32 MMA operands on a GPU)
        decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 8), 16, (40, 9), "random", True, act="float32"),
        # a one-token sequence without sinks under flat weights: its output is V, rounded as the kernel reads it
        decode_cell("decode", "turboquant_k3v4_nc", "aos", (4, 2), 16, (1, 17), "random", False, range="small-q",
                    act="float16"),
    ]
    if tier == "ci":
        out.append(decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 16, (256,), "hadamard", False))
        # FlyDSL-kernel shapes past one 64-token partition: G=16 with block 32, G=6 with block 32
        out.append(decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 16), 32, (130, 64), "hadamard", False))
        out.append(decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 32, (100, 7), "random", False))
    if tier == "full":
        # long float16 sequences: rounding of P and V accumulates over thousands of tokens
        out.append(decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 16, (4096, 1000), "hadamard", False,
                               range="wide", act="float16"))
        out.append(decode_cell("decode", "turboquant_k3v4_nc", "aos", (4, 6), 32, (4096,), "random", True,
                               act="float16"))
        out.append(decode_cell("store_decode", "turboquant_3bit_nc", "soa", (2, 8), 16, (2048, 2049), "random",
                               False, range="wide", act="float16"))
        for n in (1, 4, 16):
            for L in (256, 1024, 4096):
                for hk_g in ((8, 8), (8, 16), (4, 6)):
                    for bs in (16, 32):
                        out.append(decode_cell("decode", "turboquant_4bit_nc", "soa", hk_g, bs, (L,) * n,
                                               "hadamard", False))
    return out


def non_power_of_two(tier: str) -> list[Cell]:
    """Head size 96 (Phi-class models): every preset, both layouts, the seeded random rotation that the reference
    defines there (``reference.turboquant.rotation``); the full tier adds more shapes and dtypes."""
    out = [
        store_cell("turboquant_4bit_nc", "soa", 2, 16, 17, "random", D=96),
        store_cell("turboquant_k3v4_nc", "aos", 2, 16, 9, "random", D=96, act="float16"),
        decode_cell("decode", "turboquant_3bit_nc", "aos", (2, 4), 16, (20, 5), "random", True, D=96),
        decode_cell("decode", "turboquant_k8v4", "soa", (4, 2), 16, (9, 17), "none", False, D=96, act="float16"),
        decode_cell("store_decode", "turboquant_4bit_nc", "soa", (2, 6), 32, (33, 1), "random", False, D=96),
    ]
    if tier == "full":
        out += [
            store_cell("turboquant_3bit_nc", "soa", 8, 64, 256, "random", D=96, range="wide", act="float16"),
            store_cell("turboquant_k8v4", "aos", 4, 32, 64, "none", D=96, act="float16"),
            decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 8), 16, (1024, 17), "random", False, D=96,
                        range="wide", act="float16"),
            decode_cell("decode", "turboquant_k3v4_nc", "soa", (4, 6), 32, (256, 1, 100), "random", True, D=96,
                        act="float32"),
            decode_cell("decode", "turboquant_4bit_nc", "aos", (2, 16), 64, (130, 64), "random", True, D=96,
                        range="small-q"),
            decode_cell("store_decode", "turboquant_3bit_nc", "aos", (8, 1), 16, (48, 33, 1), "random", False, D=96,
                        act="float16"),
            decode_cell("store_decode", "turboquant_k8v4", "aos", (2, 8), 16, (40, 9), "none", True, D=96,
                        range="wide", act="bfloat16"),
        ]
    return out


def adversarial(tier: str) -> list[Cell]:
    """Adversarial draws (``inputs.PATTERNS``): near-duplicate keys (quantization and softmax ties), correlated
    keys, activations at the float16 edge (large queries and values, key norms near the fp16 k_norm limit) and
    queries aligned with one key (a peaked softmax); the full tier adds the other presets, layouts and D=96."""
    out = [
        decode_cell("store_decode", "turboquant_4bit_nc", "soa", (2, 4), 16, (33, 17), "random", False,
                    act="float32", pattern="near-duplicate"),
        decode_cell("decode", "turboquant_k3v4_nc", "aos", (2, 4), 16, (24, 9), "random", True,
                    pattern="correlated"),
        decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 16, (40, 9), "hadamard", False, act="float16",
                    pattern="dtype-edge"),
        decode_cell("store_decode", "turboquant_k3v4_nc", "aos", (2, 4), 32, (20, 5), "random", True,
                    pattern="norm-edge"),
        decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 8), 16, (24, 7), "hadamard", False,
                    pattern="aligned"),
        decode_cell("store_decode", "turboquant_4bit_nc", "aos", (2, 4), 16, (17, 3), "random", True, D=96,
                    act="float16", pattern="aligned"),
    ]
    if tier == "full":
        out += [
            store_cell("turboquant_4bit_nc", "soa", 4, 16, 64, "random", act="float32", pattern="near-duplicate"),
            store_cell("turboquant_3bit_nc", "soa", 2, 32, 33, "random", D=96, act="float32",
                       pattern="near-duplicate"),
            store_cell("turboquant_4bit_nc", "soa", 4, 16, 33, "hadamard", act="bfloat16", pattern="norm-edge"),
            store_cell("turboquant_k8v4", "soa", 2, 16, 33, "none", act="float16", pattern="dtype-edge"),
            decode_cell("decode", "turboquant_3bit_nc", "soa", (8, 8), 16, (256, 31), "hadamard", True,
                        act="bfloat16", pattern="near-duplicate"),
            decode_cell("decode", "turboquant_k8v4", "aos", (4, 6), 32, (64, 1), "none", False, act="float16",
                        pattern="near-duplicate"),
            decode_cell("decode", "turboquant_4bit_nc", "soa", (8, 16), 32, (130, 64), "random", False,
                        pattern="correlated"),
            decode_cell("store_decode", "turboquant_3bit_nc", "aos", (4, 2), 16, (48, 16), "random", False, D=96,
                        act="float16", pattern="correlated"),
            decode_cell("decode", "turboquant_4bit_nc", "soa", (4, 6), 32, (100, 7), "random", True,
                        act="bfloat16", pattern="dtype-edge"),
            decode_cell("decode", "turboquant_k8v4", "aos", (2, 4), 16, (33, 2), "none", True, act="float16",
                        pattern="dtype-edge"),
            decode_cell("decode", "turboquant_3bit_nc", "soa", (2, 8), 16, (40, 9), "random", False, D=96,
                        act="float16", pattern="dtype-edge"),
            decode_cell("store_decode", "turboquant_4bit_nc", "soa", (4, 6), 16, (64, 9), "hadamard", False,
                        act="float16", pattern="norm-edge"),
            decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 16), 32, (130, 64), "hadamard", False,
                        pattern="aligned"),
            decode_cell("decode", "turboquant_k3v4_nc", "soa", (8, 8), 16, (256, 1), "random", True, act="float32",
                        pattern="aligned"),
            decode_cell("store_decode", "turboquant_k8v4", "soa", (2, 4), 32, (40, 9), "none", False,
                        act="float16", pattern="aligned"),
        ]
    return out


def fp32_edge(tier: str) -> list[Cell]:
    """Logits of 150 (the "logit-edge" pattern): ci a decode and a store_decode (D = 96), full every preset."""
    out = [
        decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 4), 16, (24, 7), "hadamard", False, pattern="logit-edge"),
        decode_cell("store_decode", "turboquant_k3v4_nc", "aos", (2, 4), 16, (17, 3), "random", True, D=96,
                    act="float16", pattern="logit-edge"),
    ]
    if tier == "full":
        out += [
            decode_cell("decode", "turboquant_3bit_nc", "soa", (4, 6), 32, (130, 64), "random", True, act="float32",
                        pattern="logit-edge"),
            decode_cell("decode", "turboquant_k8v4", "aos", (2, 8), 16, (40, 9), "none", False, act="bfloat16",
                        pattern="logit-edge"),
            decode_cell("store_decode", "turboquant_4bit_nc", "aos", (8, 8), 16, (256, 1), "hadamard", True,
                        act="float16", pattern="logit-edge"),
        ]
    return out


BIG_POOL = 66000      # slots: past 2^16, where 16-bit slot arithmetic wraps


def big_pools(tier: str) -> list[Cell]:
    """Caches of ``BIG_POOL`` slots at one kv head of D = 64 (one of D = 96), half the blocks used past slot
    65535: ci a store, a decode and a store_decode; full each layout and more presets."""
    out = [
        store_cell("turboquant_4bit_nc", "soa", 1, 16, 64, "hadamard", D=64, pool=BIG_POOL),
        decode_cell("decode", "turboquant_k3v4_nc", "aos", (1, 4), 16, (40, 9, 17), "random", True, D=64,
                    pool=BIG_POOL),
        decode_cell("store_decode", "turboquant_4bit_nc", "soa", (1, 2), 32, (33, 5), "random", False, D=96,
                    act="float16", pool=BIG_POOL),
    ]
    if tier == "full":
        out += [
            store_cell("turboquant_k8v4", "aos", 1, 32, 256, "none", D=64, act="float16", pool=BIG_POOL),
            decode_cell("decode", "turboquant_3bit_nc", "soa", (1, 8), 16, (200, 1, 64), "hadamard", False, D=64,
                        act="float32", pool=BIG_POOL),
            decode_cell("store_decode", "turboquant_k8v4", "aos", (1, 4), 16, (100, 17), "none", True, D=64,
                        pool=BIG_POOL),
        ]
    return out


def smoke() -> list[Cell]:
    """The smoke tier: two stores, two decodes, two store_decodes (bfloat16, float16 and float32)."""
    return [
        store_cell("turboquant_4bit_nc", "aos", 4, 16, 17, "hadamard"),
        store_cell("turboquant_3bit_nc", "soa", 2, 32, 17, "random", range="wide", act="float16"),
        decode_cell("decode", "turboquant_4bit_nc", "aos", (8, 8), 16, (17, 5), "hadamard", False),
        decode_cell("decode", "turboquant_k3v4_nc", "soa", (4, 6), 16, (20, 1, 33), "random", True, act="float16"),
        decode_cell("store_decode", "turboquant_k8v4", "aos", (2, 4), 32, (9, 40), "none", False, act="float32"),
        decode_cell("store_decode", "turboquant_4bit_nc", "soa", (8, 1), 16, (16, 17), "random", True),
    ]


@lru_cache(maxsize=None)
def _cells(tier: str) -> tuple[Cell, ...]:
    if tier == "smoke":
        return tuple(smoke())
    if tier not in ("ci", "full"):
        raise ValueError(f"tier must be smoke, ci or full, got {tier!r}")
    store_axes, decode_axes = axes(tier)
    out = [store_cell(**row) for row in pairwise(store_axes)]
    for op in ("decode", "store_decode"):
        for row in pairwise(decode_axes, valid_decode):
            lens = seq_lens_for(row.pop("num_seqs"), row.pop("max_len"), row.pop("mix"))
            out.append(decode_cell(op, lens=lens, **row))
    out += corners(tier) + non_power_of_two(tier) + adversarial(tier) + fp32_edge(tier) + big_pools(tier)
    unique = dict.fromkeys(out)  # k8v4 rows collapse onto rotation=none; keep the first
    return tuple(unique)


def cells(tier: str) -> list[Cell]:
    """The cells of ``tier`` in a deterministic order (store, decode, store_decode, corners)."""
    return list(_cells(tier))
