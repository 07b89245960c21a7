"""GDN matrix: the axes of each op, which combinations are valid, the named corners and the tiers.

A cell's params: gating {HV, T, act}; recurrent/chunked {state, H, HV, K, lens, decay, slots, qk,
interval (recurrent) or split (chunked), act}; decode {state, H, HV, K, V, N, decay, slots, qk, act};
spec_decode {state, H, HV, K, drafts, accepted, decay, slots, qk, act}. ``act`` is the activations'
dtype (q, k, v, beta, a, b, dt_bias); ``qk`` "large" scales q and k by 2^8 before the l2 norm, so a
sum of squares in float16 overflows.
"""
from __future__ import annotations

from conformance.cells import Cell, make_cell
from conformance.covering import pairwise

FAMILY = "gdn"
OPS = ("gating", "recurrent", "chunked", "decode", "spec_decode")
CHUNK = 64

STATES = ["float32", "bfloat16", "float16"]
HEADS = [(4, 4), (2, 4), (4, 12), (16, 32)]
DECAYS = ["strong", "weak", "zero"]
SLOTS = ["shuffled", "padded"]
QK = ["unit", "large"]
ACTS = ["bfloat16", "float16", "float32"]


def axes(op: str, tier: str) -> dict:
    """Axes of one op in a tier, in cell-id order."""
    full = tier == "full"
    if op == "gating":
        return {"HV": [4, 12, 32], "T": [1, 9, 65] + ([2048] if full else []), "act": ACTS}
    K = [64, 128] if full else [64]
    if op in ("recurrent", "chunked"):
        lens = [(1,), (63,), (64,), (65,), (1, 2, 3), (63, 64, 65)]
        if full:
            lens += [(127, 128, 129), (273,), (2048,), (1, 273, 64), (5, 2048)]
        last = ({"interval": [1, 16, 64]} if op == "recurrent"
                else {"split": [None, 64, 37] + ([128, 100] if full else [])})
        return {"state": STATES, "heads": HEADS, "K": K, "lens": lens, "decay": DECAYS,
                "slots": SLOTS, "qk": QK, **last, "act": ACTS}
    if op == "decode":
        KV = [(64, 64), (128, 128), (128, 64), (64, 128)] if full else [(64, 64), (64, 32), (32, 64)]
        return {"state": STATES, "heads": HEADS, "KV": KV, "N": [1, 3, 8], "decay": DECAYS,
                "slots": SLOTS, "qk": QK, "act": ACTS}
    if op == "spec_decode":
        return {"state": STATES, "heads": HEADS, "K": K, "drafts": [(4,), (1, 3, 4), (2, 4, 4, 1)],
                "accepted": ["0", "1", "S", "mix"], "decay": DECAYS, "slots": SLOTS, "qk": QK, "act": ACTS}
    raise ValueError(f"op: expected one of {OPS}, got {op!r}")


def valid(row: dict) -> bool:
    """False for a chunked row whose split lies past every sequence (a second call with no tokens)."""
    split = row.get("split")
    if split is not None and "lens" in row and max(row["lens"]) <= split:
        return False
    return True


def corners(op: str, tier: str) -> list[dict]:
    """Named corners: real model shapes and chunk edges at K=128 (small in ci); where float16 range
    matters: q, k in the hundreds before the l2 norm, strong decay, the longest sequences."""
    if op == "gating":
        return [dict(HV=12, T=65, act="float16")]  # |a| up to ~25: exp overflows float16 past 11.1
    if op == "recurrent":
        return [dict(state="bfloat16", heads=(4, 12), K=128, lens=(127, 128, 129), decay="weak",
                     slots="padded", qk="unit", interval=64, act="bfloat16"),
                dict(state="float32", heads=(2, 4), K=128, lens=(273,), decay="strong", slots="shuffled",
                     qk="large", interval=16, act="float16")]
    if op == "chunked":
        out = [dict(state="bfloat16", heads=(4, 12), K=128, lens=(127, 128, 129), decay="weak",
                    slots="shuffled", qk="unit", split=None, act="bfloat16"),
               dict(state="float16", heads=(2, 4), K=128, lens=(273,), decay="weak", slots="padded",
                    qk="large", split=100, act="float16"),
               dict(state="float32", heads=(2, 4), K=64, lens=(273,), decay="zero", slots="shuffled",
                    qk="unit", split=128, act="float32")]
        if tier == "full":
            out += [dict(state="bfloat16", heads=(16, 32), K=128, lens=(2048,), decay="weak",
                         slots="shuffled", qk="unit", split=1024, act="bfloat16"),
                    dict(state="float32", heads=(16, 32), K=128, lens=(2048,), decay="weak",
                         slots="shuffled", qk="large", split=None, act="float16")]
        return out
    if op == "decode":
        return [dict(state="bfloat16", heads=(16, 32), KV=(128, 128), N=4, decay="strong",
                     slots="padded", qk="unit", act="bfloat16"),
                dict(state="float16", heads=(16, 32), KV=(128, 128), N=4, decay="strong",
                     slots="padded", qk="large", act="float16")]
    if op == "spec_decode":
        return [dict(state="bfloat16", heads=(4, 12), K=128, drafts=(4, 2), accepted="mix",
                     decay="weak", slots="padded", qk="unit", act="bfloat16"),
                dict(state="float32", heads=(4, 12), K=128, drafts=(4, 2), accepted="mix",
                     decay="strong", slots="padded", qk="large", act="float16")]
    return []


def cell_of(op: str, row: dict) -> Cell:
    """The cell of one matrix row (``heads`` -> H, HV; ``KV`` -> K, V)."""
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
            make_cell(FAMILY, "gating", HV=12, T=9, act="bfloat16"),
            cell_of("recurrent", dict(state="bfloat16", heads=(2, 4), K=64, lens=(1, 2, 3), decay="weak",
                                      slots="padded", qk="unit", interval=1, act="bfloat16")),
            cell_of("chunked", dict(state="bfloat16", heads=(2, 4), K=64, lens=(63, 65), decay="weak",
                                    slots="shuffled", qk="unit", split=37, act="float16")),
            cell_of("decode", dict(state="float16", heads=(4, 12), KV=(64, 32), N=3, decay="strong",
                                   slots="padded", qk="large", act="float16")),
            cell_of("spec_decode", dict(state="float32", heads=(2, 4), K=64, drafts=(1, 3, 4),
                                        accepted="mix", decay="weak", slots="padded", qk="unit",
                                        act="float32")),
        ]
    if tier not in ("ci", "full"):
        raise ValueError(f"tier: expected smoke, ci or full, got {tier!r}")
    out = []
    for op in OPS:
        rows = pairwise(axes(op, tier), valid) + corners(op, tier)
        out += [cell_of(op, row) for row in rows]
    return out
