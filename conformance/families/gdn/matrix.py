"""GDN matrix: the axes of each op, which combinations are valid, the named corners and the tiers.

A cell's params: gating {HV, T, act}; recurrent/chunked {state, H, HV, K, lens, decay, slots, qk,
interval (recurrent) or split (chunked), act}; decode {state, H, HV, K, V, N, decay, slots, qk, act};
spec_decode {state, H, HV, K, drafts, accepted, decay, slots, qk, act}. ``act`` is the activations'
dtype (q, k, v, beta, a, b, dt_bias); ``qk`` "large" scales q and k by 2^8 before the l2 norm, so a
sum of squares in float16 overflows.

Named corners may add: ``steps`` (decode: the op called that many times, one token per sequence a
call, the pool carried from call to call as a server does) or ``calls`` (recurrent: each sequence fed
in that many equal calls, the pool carried); the adversarial generators ``keys`` ("near-duplicate":
every key of a head within 1e-3 of one vector; "correlated": within 0.1, cosine ~0.995), ``beta``
("edges": beta exactly 0 or 1), ``v`` ("near-max": |v| up to 6e4, the edge of float16; spec_decode's pool then
starts grown, as after a long chain of such v: ``inputs.GROWN_STATE``); and the decay
regimes "near-one" (per-token decay 0.99985 .. 0.99995, which bfloat16 rounds to 1) and "extreme"
(g from -20 to -1e4, exp(g) underflows; a chunk's cumulative decay reaches -6e5).

Parameters as checkpoints store them (``checkpoint_params``, ``params`` "float32"): A_log and dt_bias in float32
at full precision beside 16-bit activations (``inputs.as_checkpoint``); the reference upcasts each argument
to float32 as the serving kernels do.

Long calls and big pools (``long_and_big``): one chunked or recurrent call of 4097 tokens (ci) or 33000 (full,
past int16 token offsets) at one head of K = 64; pools (``pool``: slot count) of 66000 slots at K = V = 8,
half the slots used past 65535, where 16-bit index arithmetic wraps (the reference indexes in int64).

The edge of float32 (``fp32_edge``): gating with ``a`` "edge" (a + dt_bias of 100 to 1000, past 88.7 where
exp overflows float32: the reference's softplus is x above its threshold 20); decode and spec_decode with
decay "gate-edge" (every other token's a + dt_bias past 100, exp(A_log) ~ 1e-3 so the decay still matters);
recurrent and chunked with decay "steady" (g ~ -1.5 every token: a chunk's local cumulative decay passes -88,
where exp(-G) overflows; the reference multiplies only by exp(G_i - G_j) <= 1).

Long acceptance (``acceptance``): spec_decode with every sequence drafting T tokens, T in {1, 2, 4, 8},
and ``accepted`` "ladder": sequence n resumes after ladder(T)[n] accepted tokens of the previous step,
ladder(T) = {0, 1, 2, T-1, T} within [0, T] (``accepted_ladder``). The reference resumes from
column max(accepted - 1, 0) of the sequence's row of ``spec_state_indices`` whatever the count, so a
kernel that clamps the count, or handles only 0, 1 and the last column, reads another slot's state.
"""
from __future__ import annotations

from conformance.cells import Cell, make_cell
from conformance.covering import pairwise

FAMILY = "gdn"
OPS = ("gating", "recurrent", "chunked", "decode", "spec_decode")
CHUNK = 64

STATES = ["float32", "bfloat16", "float16"]
HEADS = [(4, 4), (2, 4), (4, 12), (16, 32)]
DECAYS = ["strong", "weak", "zero"]        # the pairwise axis; corners also use "near-one", "extreme"
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
        return [dict(HV=12, T=65, act="float16")] + fp32_edge(op, tier) + checkpoint_params(op, tier)  # |a| ~25: exp overflows float16 past 11.1
    if op == "recurrent":
        return [dict(state="bfloat16", heads=(4, 12), K=128, lens=(127, 128, 129), decay="weak",
                     slots="padded", qk="unit", interval=64, act="bfloat16"),
                dict(state="float32", heads=(2, 4), K=128, lens=(273,), decay="strong", slots="shuffled",
                     qk="large", interval=16, act="float16")] + recurrent_chains(tier) + adversarial(op, tier) + \
            fp32_edge(op, tier) + long_and_big(op, tier)
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
        return out + adversarial(op, tier) + fp32_edge(op, tier) + long_and_big(op, tier)
    if op == "decode":
        return [dict(state="bfloat16", heads=(16, 32), KV=(128, 128), N=4, decay="strong",
                     slots="padded", qk="unit", act="bfloat16"),
                dict(state="float16", heads=(16, 32), KV=(128, 128), N=4, decay="strong",
                     slots="padded", qk="large", act="float16")] + decode_chains(tier) + fp32_edge(op, tier) + \
            long_and_big(op, tier) + checkpoint_params(op, tier)
    if op == "spec_decode":
        return [dict(state="bfloat16", heads=(4, 12), K=128, drafts=(4, 2), accepted="mix",
                     decay="weak", slots="padded", qk="unit", act="bfloat16"),
                dict(state="float32", heads=(4, 12), K=128, drafts=(4, 2), accepted="mix",
                     decay="strong", slots="padded", qk="large", act="float16"),
                # a grown float32 pool read by float16 activations: the unscaled readout q^T S passes 65504
                dict(state="float32", heads=(2, 4), K=64, drafts=(4, 2), accepted="mix", decay="near-one",
                     slots="shuffled", qk="unit", act="float16", v="near-max")] + acceptance(tier) + \
            fp32_edge(op, tier) + long_and_big(op, tier) + checkpoint_params(op, tier)
    return []


DRAFTS = (1, 2, 4, 8)


def accepted_ladder(T: int) -> tuple[int, ...]:
    """The accepted counts a T-draft sequence is resumed with: {0, 1, 2, T-1, T} within [0, T], ascending."""
    return tuple(sorted({a for a in (0, 1, 2, T - 1, T) if 0 <= a <= T}))


def acceptance(tier: str) -> list[dict]:
    """spec_decode with T drafts per sequence (T in ``DRAFTS``), one sequence per accepted count of
    ``accepted_ladder(T)``: ci one cell per T at small heads (each state and activation dtype
    once), full every T in every state dtype at K=128."""
    def row(T, state, act, heads=(2, 4), K=64, slots="shuffled"):
        return dict(state=state, heads=heads, K=K, drafts=(T,) * len(accepted_ladder(T)), accepted="ladder",
                    decay="weak", slots=slots, qk="unit", act=act)
    if tier != "full":
        return [row(1, "bfloat16", "bfloat16"), row(2, "float16", "float16"), row(4, "float32", "float32"),
                row(8, "bfloat16", "bfloat16", slots="padded")]
    return [row(T, state, act, heads=(4, 12), K=128, slots=slots) for T in DRAFTS
            for state, act, slots in (("float32", "bfloat16", "shuffled"), ("bfloat16", "bfloat16", "padded"),
                                      ("float16", "float16", "shuffled"))]


def checkpoint_params(op: str, tier: str) -> list[dict]:
    """Float32 A_log and dt_bias beside 16-bit activations: ci one cell an op, full each 16-bit dtype."""
    acts = ("bfloat16", "float16") if tier == "full" else (("bfloat16",) if op != "spec_decode" else ("float16",))
    if op == "gating":
        return [dict(HV=12, T=9, act=act, params="float32") for act in acts]
    if op == "decode":
        return [dict(state=state, heads=(4, 12), KV=(64, 64), N=3, decay="strong", slots="padded", qk="unit",
                     act=act, params="float32") for act, state in zip(acts, ("bfloat16", "float32"))]
    if op == "spec_decode":
        return [dict(state=state, heads=(2, 4), K=64, drafts=(4, 2), accepted="mix", decay="strong",
                     slots="shuffled", qk="unit", act=act, params="float32") for act, state in zip(acts, ("float32", "bfloat16"))]
    return []


BIG_POOL = 66000


def long_and_big(op: str, tier: str) -> list[dict]:
    """A long call (4097 tokens in ci, 33000 in full) at heads (1, 1), K = 64, and a pool of ``BIG_POOL``
    slots at K = V = 8 (the C++ chunk kernel takes multiples of 32: full adds a chunked pool at K = 32,
    72M elements)."""
    full = tier == "full"
    if op in ("recurrent", "chunked"):
        last = {"interval": 64} if op == "recurrent" else {"split": None}
        L = 33000 if full else 4097
        out = [dict(state="bfloat16", heads=(1, 1), K=64, lens=(L,), decay="weak", slots="shuffled", qk="unit",
                    **last, act="bfloat16")]
        for K in (8, 32) if full and op == "chunked" else (8,):
            out.append(dict(state="float16", heads=(1, 1), K=K, lens=(5, 9, 3), decay="weak", slots="padded",
                            qk="unit", **last, act="float16", pool=BIG_POOL))
        return out
    if op == "decode":
        return [dict(state="bfloat16", heads=(1, 1), KV=(8, 8), N=4, decay="weak", slots="padded", qk="unit",
                     act="bfloat16", pool=BIG_POOL)] + \
            ([dict(state="float32", heads=(1, 2), KV=(16, 16), N=8, decay="strong", slots="shuffled", qk="unit",
                   act="float16", pool=BIG_POOL)] if full else [])
    if op == "spec_decode":
        return [dict(state="float32", heads=(1, 1), K=8, drafts=(4, 2, 3), accepted="mix", decay="weak",
                     slots="shuffled", qk="unit", act="bfloat16", pool=BIG_POOL)]
    return []


def fp32_edge(op: str, tier: str) -> list[dict]:
    """Inputs past float32's exp range (module docstring): ci one or two cells an op, full each activation
    dtype (gating, decode) or state dtype (varlen, spec_decode) at larger heads. Float32 gating there is
    full-tier only: the gating tolerance (16 u32) is short of the reference's own error at these inputs."""
    full = tier == "full"
    if op == "gating":
        return [dict(HV=HV, T=65, act=act, a="edge") for HV, act in
                ((4, "bfloat16"), (12, "float16")) + (((32, "float32"),) if full else ())]
    heads, K = ((4, 12), 128) if full else ((2, 4), 64)
    if op == "decode":
        return [dict(state=state, heads=heads, KV=(K, K), N=N, decay="gate-edge", slots="shuffled", qk="unit",
                     act=act) for state, act, N in (("float32", "bfloat16", 3), ("bfloat16", "float16", 8))
                + ((("float16", "float32", 4),) if full else ())]
    if op == "spec_decode":
        return [dict(state=state, heads=heads, K=K, drafts=(4, 2), accepted="mix", decay="gate-edge",
                     slots="padded", qk="unit", act=act) for state, act in
                (("bfloat16", "bfloat16"),) + ((("float32", "float16"), ("float16", "float32")) if full else ())]
    last = {"interval": 1} if op == "recurrent" else {"split": None}
    lens = [(64, 129) if full else (64,)] + ([(273,), (2048,)] if full else [])
    return [dict(state=state, heads=heads, K=K, lens=L, decay="steady", slots="shuffled", qk="unit", **last,
                 act=act) for L, (state, act) in zip(lens, (("bfloat16", "bfloat16"), ("float32", "float32"),
                                                            ("float16", "float16")))]


CI_STEPS = 256                      # a chain the Triton interpreter runs in seconds
FULL_STEPS = (4096, 16384)
SHORT_STEPS = {"bfloat16": 16, "float16": 4}   # chains whose 16-bit pool's tie flips stay few


def decode_chains(tier: str) -> list[dict]:
    """Decode called ``steps`` times, the pool carried, per-token decay near 1: each state dtype
    (16-bit drift against the float32-state truth); in float16 activations a float32 pool fed
    |v| near the float16 range, whose grown state puts the unscaled readout q^T S past 65504; and short
    16-bit chains (``SHORT_STEPS``, o in float32) where o's bound is the few tie flips a later call reads."""
    def chain(state, act, steps, KV=(32, 32), **extra):
        return dict(state=state, heads=(2, 4), KV=KV, N=2, decay="near-one", slots="shuffled", qk="unit",
                    act=act, **extra, steps=steps)
    short = [chain(state, "float32", steps) for state, steps in SHORT_STEPS.items()]
    if tier != "full":
        return [chain("bfloat16", "bfloat16", CI_STEPS), chain("float16", "float16", CI_STEPS),
                chain("float32", "float16", CI_STEPS, KV=(64, 64), v="near-max")] + short
    out = [chain(state, "bfloat16", steps, KV=(128, 128)) for steps in FULL_STEPS
           for state in ("float32", "bfloat16", "float16")]
    out += [chain("float16", "float16", 4096, KV=(128, 128)), chain("float32", "float32", 4096, KV=(128, 128)),
            chain("float32", "float16", 4096, KV=(64, 64), v="near-max")]
    return out + short


def recurrent_chains(tier: str) -> list[dict]:
    """One long sequence fed to the recurrent op in ``calls`` equal calls, the pool carried, per-token
    decay near 1 (ci: 512 tokens in 32 calls; full: 4096 in 64 and 16384 in 256)."""
    def chain(state, act, L, calls, **extra):
        return dict(state=state, heads=(2, 4), K=64, lens=(L,), decay="near-one", slots="shuffled", qk="unit",
                    interval=1, act=act, **extra, calls=calls)
    if tier != "full":
        return [chain("bfloat16", "float32", 512, 32), chain("float32", "float16", 512, 32)]
    return [chain(state, act, L, calls) for L, calls in ((4096, 64), (16384, 256))
            for state, act in (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"))]


def adversarial(op: str, tier: str) -> list[dict]:
    """The adversarial generators on the varlen ops: near-duplicate and correlated keys (the chunk
    form's (I + strictly-lower beta K K^T) inverse), no decay and extreme decay, beta at exactly 0
    and 1, |v| near the float16 range."""
    def row(state, K, lens, decay, act, **extra):
        last = {"interval": 1} if op == "recurrent" else {"split": None}
        return dict(state=state, heads=(2, 4), K=K, lens=lens, decay=decay, slots="shuffled", qk="unit",
                    **last, act=act, **extra)
    out = [row("float32", 64, (129,), "zero", "bfloat16", keys="near-duplicate"),
           row("bfloat16", 64, (129,), "extreme", "float16", keys="correlated"),
           row("float32", 64, (65,), "zero", "float32", beta="edges")]
    if tier == "full":
        if op == "chunked":   # its float32 state passes 65504: FLA's float16 chunk-state store overflows
            out.append(row("float32", 64, (129,), "near-one", "float16", v="near-max"))
        out += [row("float16", 128, (273,), "zero", "float16", keys="near-duplicate"),
                row("float32", 128, (273,), "extreme", "bfloat16", keys="near-duplicate"),
                row("bfloat16", 128, (273,), "zero", "bfloat16", keys="correlated", beta="edges")]
    return out


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
