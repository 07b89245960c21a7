"""Study ``gdn-drift``: how far a bfloat16 or float16 GDN state drifts from a float32 state.

Three measurements, all with the JAX reference's chunked form (fp32 compute, the state stored
every 64 tokens, as the CPU chunk kernel does), one sequence, H/HV/K=V from the arguments:

- length sweep: one long prefill cut at chunk-aligned lengths (a cut at a chunk end changes
  nothing); at each length, the relative L2 error of that segment's outputs and of the stored
  state, 16-bit state against float32 state;
- round trips: a prefill of ``--round-trip-tokens`` split at N unaligned points, each call seeded
  from the previous call's stored state (a prefix-cache hit re-seeds from a stored state; the
  chunk grid restarts at the split); error against the float32 state without splits;
- overflow probe: large v (``--v-scale``) with weak decay; float16 state overflow (Inf/NaN in the
  state or the outputs, or a float32 state beyond 65504) is reported as such, never hidden;
- decode chains: the decode op (``reference.gdn.numpy_ref``, fp32 compute) called once per token of
  ``--decode-sequences`` sequences, the pool carried, per-token decay near 1 (0.99985 .. 0.99995,
  which bfloat16 rounds to 1: the gdn matrix's "near-one" decode inputs); after each of
  ``--decode-steps`` calls, the relative L2 error of all outputs so far and of the pool, per state
  dtype, against the fp32-state truth (the same chain in float64 with a float32 pool), so float32's
  row is the fp32 arithmetic alone. ``--decode-only`` skips the prefill measurements.
"""
from __future__ import annotations

import sys

import numpy as np

from conformance.run.progress import Progress
from conformance.studies import bounded_int, int_list, positive_float

NAME = "gdn-drift"
DESCRIPTION = ("relative L2 error of outputs and state for bfloat16/float16 GDN state against float32 "
               "state, as T grows and over split-and-resume round trips; float16 overflow probe")
CHUNK = 64
FP16_MAX = 65504.0


def add_arguments(parser) -> None:
    parser.add_argument("--tokens", type=int, default=65536, help="longest prefill (default 65536)")
    parser.add_argument("--heads", default="2,4", help="H,HV (default 2,4)")
    parser.add_argument("--dim", type=int, default=128, help="K = V (default 128)")
    parser.add_argument("--decay", choices=("weak", "strong", "zero"), default="weak")
    parser.add_argument("--round-trips", default="0,1,4,16,64", help="numbers of split-and-resume calls")
    parser.add_argument("--round-trip-tokens", type=int, default=8192)
    parser.add_argument("--v-scale", type=float, default=5e4, help="v scale of the overflow probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decode-steps", default="4096,16384",
                        help="decode chain lengths measured (one chain, the longest; default 4096,16384)")
    parser.add_argument("--decode-sequences", type=int, default=2, help="sequences of a decode call (default 2)")
    parser.add_argument("--decode-only", action="store_true", help="only the decode chains")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes for tests: 1024 tokens, K=V=64, round trips 0,4 over 512, "
                             "decode chains 64,256")


def draw_inputs(rng, T: int, H: int, HV: int, K: int, decay: str, v_scale: float = 1.0) -> dict:
    """Independent q, k, v (bf16 values), log decay g and beta for one sequence of T tokens."""
    from conformance.families.gdn.inputs import log_decay
    from conformance.numerics import bf16_round

    return {"q": bf16_round(rng.normal(size=(T, H, K))), "k": bf16_round(rng.normal(size=(T, H, K))),
            "v": bf16_round(rng.normal(size=(T, HV, K)) * v_scale),
            "g": log_decay(rng, decay, T, HV),
            "beta": bf16_round(1 / (1 + np.exp(-rng.normal(0.0, 1.5, (T, HV)))))}


def _prefill(x: dict, bounds: list[int], state_dtype: str):
    """Run the sequence as one call per segment [bounds[i], bounds[i+1]), each seeded by the last.

    Returns (o float32 [T,HV,V], float32 copies of the stored state after each segment)."""
    from reference.gdn import jax_ref
    from reference.gdn.arguments import POOL_DTYPES

    HV, K = x["v"].shape[1], x["v"].shape[2]
    pool = np.zeros((1, HV, K, K), POOL_DTYPES[state_dtype])
    outs, states = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, pool = jax_ref.chunked(*(x[n][a:b] for n in ("q", "k", "v", "g", "beta")),
                                  np.array([0, b - a], np.int32), pool, np.array([0], np.int32),
                                  state_dtype=state_dtype, chunk_size=CHUNK)
        pool = np.asarray(pool)
        outs.append(np.asarray(o, np.float32))
        states.append(pool[0].astype(np.float32))
    return np.concatenate(outs), states


def _error(actual: np.ndarray, truth: np.ndarray) -> float | None:
    """Relative L2 error; None when the actual values hold Inf/NaN (reported as overflow)."""
    from conformance.numerics import rel_l2

    if not np.all(np.isfinite(actual)):
        return None
    return rel_l2(actual, truth)


def _lengths(max_tokens: int) -> list[int]:
    """Chunk-aligned lengths 1024, 4096, ... (x4) up to and including max_tokens."""
    out, T = [], 1024
    while T < max_tokens:
        out.append(T)
        T *= 4
    return out + [max_tokens]


def _length_sweep(x: dict, lengths: list[int]) -> list[dict]:
    bounds = [0] + lengths
    o32, s32 = _prefill(x, bounds, "float32")
    rows = []
    for dtype in ("bfloat16", "float16"):
        o, states = _prefill(x, bounds, dtype)
        for i, T in enumerate(lengths):
            seg = slice(bounds[i], T)
            rows.append({"state_dtype": dtype, "tokens": T,
                         "o_rel_l2": _error(o[seg], o32[seg]), "state_rel_l2": _error(states[i], s32[i]),
                         "nonfinite": not (np.all(np.isfinite(o[seg])) and np.all(np.isfinite(states[i]))),
                         "max_abs_state_fp32": float(np.max(np.abs(s32[i])))})
    return rows


def _split_points(rng, T: int, n: int) -> list[int]:
    """n distinct split points in (0, T), none on a chunk boundary."""
    candidates = np.array([p for p in range(1, T) if p % CHUNK])
    return sorted(int(p) for p in rng.choice(candidates, size=n, replace=False))


def _round_trips(x: dict, T: int, counts: list[int], rng) -> list[dict]:
    o32, s32 = _prefill(x, [0, T], "float32")
    rows = []
    for n in counts:
        bounds = [0] + _split_points(rng, T, n) + [T]
        for dtype in ("float32", "bfloat16", "float16"):
            o, states = _prefill(x, bounds, dtype)
            rows.append({"state_dtype": dtype, "round_trips": n, "o_rel_l2": _error(o, o32),
                         "state_rel_l2": _error(states[-1], s32[0])})
    return rows


def overflow_probe(x: dict) -> dict:
    """Per state dtype: whether the state or outputs of a prefill of ``x`` hold Inf/NaN, and the largest |state|."""
    T = x["q"].shape[0]
    _, s32 = _prefill(x, [0, T], "float32")
    out = {"tokens": T, "max_abs_state_fp32": float(np.max(np.abs(s32[0]))),
           "fp32_state_exceeds_fp16_range": bool(np.max(np.abs(s32[0])) > FP16_MAX)}
    for dtype in ("bfloat16", "float16"):
        o, states = _prefill(x, list(range(0, T, 1024)) + [T], dtype)
        bad_rows = np.flatnonzero(~np.all(np.isfinite(o.reshape(T, -1)), axis=1))
        out[dtype] = {"nonfinite": bool(bad_rows.size) or not np.all(np.isfinite(states[-1])),
                      "first_nonfinite_token": int(bad_rows[0]) if bad_rows.size else None}
    return out


CHAIN_STATE_DTYPES = ("float32", "bfloat16", "float16")   # the pools the decode chains run
TICK_CALLS = 256


def decode_chain(H: int, HV: int, K: int, N: int, steps: list[int], seed: int, tick=None) -> list[dict]:
    """Per state dtype and chain length of ``steps``: rel_l2 of the outputs of all calls so far and of
    the pool after that many decode calls, against the fp32-state truth (see the module docstring);
    ``tick(calls, what)`` every ``TICK_CALLS`` calls (a progress line)."""
    from conformance.families.gdn import make_inputs
    from conformance.families.gdn.matrix import cell_of
    from conformance.families.gdn.oracle import Float64Oracle
    from reference.gdn import numpy_ref
    from reference.gdn.arguments import POOL_DTYPES

    cell = cell_of("decode", dict(state="float32", heads=(H, HV), KV=(K, K), N=N, decay="near-one",
                                  slots="shuffled", qk="unit", act="bfloat16", steps=max(steps), seed=seed))
    x = make_inputs(cell)
    opts = {n: x[n] for n in ("scale", "use_qk_l2norm", "l2norm_eps")}
    idx, written = x["state_indices"], np.sort(x["state_indices"])

    def run(impl, state_dtype: str) -> tuple[np.ndarray, dict]:
        pool = x["state"].astype(POOL_DTYPES[state_dtype])
        outs, pools = [], {}
        for s in range(max(steps)):
            if tick is not None and s % TICK_CALLS == TICK_CALLS - 1:
                tick(TICK_CALLS, f"decode chain, {state_dtype} state{' (truth)' if impl is not numpy_ref else ''}")
            rows = slice(s * N, (s + 1) * N)
            outs.append(impl.decode(*(x[n][rows] for n in ("q", "k", "v")), x["A_log"], x["a"][rows],
                                    x["b"][rows], x["dt_bias"], pool, idx, **opts, state_dtype=state_dtype))
            if s + 1 in steps:
                pools[s + 1] = pool[written].astype(np.float32)
        return np.concatenate(outs).astype(np.float32), pools

    o_truth, s_truth = run(Float64Oracle("float32"), "float32")
    rows = []
    for dtype in CHAIN_STATE_DTYPES:
        o, pools = run(numpy_ref, dtype)
        for n in steps:
            seen = slice(0, n * N)
            rows.append({"state_dtype": dtype, "steps": n, "o_rel_l2": _error(o[seen], o_truth[seen]),
                         "state_rel_l2": _error(pools[n], s_truth[n]),
                         "max_abs_state_fp32": float(np.max(np.abs(s_truth[n])))})
    return rows


MAX_TOKENS = 1 << 20   # a million tokens of one sequence: far past any model's context
MAX_HEADS = 128
MAX_DIM = 512


def check(args) -> None:
    """Every argument, before any work: ValueError naming the option."""
    heads = int_list("--heads", args.heads, 1, MAX_HEADS)
    if len(heads) != 2 or heads[1] % heads[0]:
        raise ValueError(f"--heads {args.heads!r}: expected H,HV with HV a multiple of H")
    bounded_int("--tokens", args.tokens, CHUNK, MAX_TOKENS)
    if args.tokens % CHUNK:
        raise ValueError(f"--tokens {args.tokens}: expected a multiple of {CHUNK}")
    bounded_int("--dim", args.dim, 1, MAX_DIM)
    rt_tokens = bounded_int("--round-trip-tokens", args.round_trip_tokens, 1, MAX_TOKENS)
    if args.round_trip_tokens > args.tokens:
        raise ValueError(f"--round-trip-tokens {rt_tokens}: expected at most --tokens ({args.tokens})")
    int_list("--round-trips", args.round_trips, 0, rt_tokens - 1)
    positive_float("--v-scale", args.v_scale, 1e30)
    int_list("--decode-steps", args.decode_steps, 1, MAX_TOKENS)
    bounded_int("--decode-sequences", args.decode_sequences, 1, MAX_HEADS)


def run(args) -> dict:
    """The study (arguments checked by ``check``); JSON-able result."""
    H, HV = (int(s) for s in args.heads.split(","))
    tokens, K = (1024, 64) if args.quick else (args.tokens, args.dim)
    counts = [0, 4] if args.quick else [int(s) for s in args.round_trips.split(",")]
    rt_tokens = 512 if args.quick else args.round_trip_tokens
    steps = [64, 256] if args.quick else sorted(set(int(s) for s in args.decode_steps.split(",")))
    config = {"H": H, "HV": HV, "K": K, "V": K, "decay": args.decay, "chunk": CHUNK, "seed": args.seed,
              "decode_steps": steps, "decode_sequences": args.decode_sequences,
              "decode_implementation": "reference.gdn.numpy_ref.decode (fp32 compute), decay near 1; truth: "
                                       "the same chain in float64 with a float32 pool"}
    # the progress line counts decode calls; each prefill measurement weighs as much as one chain
    chain_calls = max(steps)
    bar = Progress((1 + len(CHAIN_STATE_DTYPES) + (0 if args.decode_only else 3)) * chain_calls, sys.stderr)
    chains = decode_chain(H, HV, K, args.decode_sequences, steps, args.seed,
                          tick=lambda n, what: bar.advance(n, f"{NAME}: {what}"))
    if args.decode_only:
        bar.advance(0, f"{NAME}: done", finished=True)
        return {"study": NAME, "config": config, "decode_chain": chains}
    rng = np.random.default_rng(args.seed)
    x = draw_inputs(rng, tokens, H, HV, K, args.decay)
    probe = draw_inputs(rng, min(tokens, 4096), H, HV, K, "weak", args.v_scale)
    bar.advance(0, f"{NAME}: length sweep to {tokens} tokens")
    sweep = _length_sweep(x, _lengths(tokens))
    bar.advance(chain_calls, f"{NAME}: {len(counts)} round-trip counts over {rt_tokens} tokens")
    trips = _round_trips({n: a[:rt_tokens] for n, a in x.items()}, rt_tokens, counts, rng)
    bar.advance(chain_calls, f"{NAME}: overflow probe")
    overflow = overflow_probe(probe)
    bar.advance(chain_calls, f"{NAME}: done", finished=True)
    return {
        "study": NAME,
        "config": {**config, "tokens": tokens, "round_trip_tokens": rt_tokens, "v_scale_probe": args.v_scale,
                   "implementation": "reference.gdn.jax_ref.chunked (fp32 compute)"},
        "length_sweep": sweep,
        "round_trips": trips,
        "overflow_probe": overflow,
        "decode_chain": chains,
    }


def _fmt(value) -> str:
    return "OVERFLOW" if value is None else f"{value:.3e}"


def overflow_text(probe: dict) -> str:
    """One dtype's ``overflow_probe`` entry in words."""
    if not probe["nonfinite"]:
        return "finite"
    token = probe["first_nonfinite_token"]
    return "OVERFLOW " + (f"(first Inf/NaN output at token {token})" if token is not None else "(state)")


def summarize(result: dict) -> str:
    """A short table of the study."""
    c = result["config"]
    chain = [f"decode chains ({c['decode_sequences']} sequences a call, decay near 1, against the fp32-state truth)",
             f"{'state':>9} {'steps':>7} {'o rel_l2':>10} {'state rel_l2':>12}"]
    chain += [f"{r['state_dtype']:>9} {r['steps']:>7} {_fmt(r['o_rel_l2']):>10} {_fmt(r['state_rel_l2']):>12}"
              for r in result["decode_chain"]]
    head = f"gdn-drift: H={c['H']} HV={c['HV']} K=V={c['K']}"
    if "length_sweep" not in result:
        return "\n".join([head] + chain)
    lines = [f"{head} decay={c['decay']} (chunk {c['chunk']})",
             f"{'state':>9} {'tokens':>7} {'o rel_l2':>10} {'state rel_l2':>12}"]
    for r in result["length_sweep"]:
        lines.append(f"{r['state_dtype']:>9} {r['tokens']:>7} {_fmt(r['o_rel_l2']):>10} "
                     f"{_fmt(r['state_rel_l2']):>12}")
    lines.append(f"{'state':>9} {'trips':>7} {'o rel_l2':>10} {'state rel_l2':>12}   "
                 f"({c['round_trip_tokens']} tokens, unaligned splits)")
    for r in result["round_trips"]:
        lines.append(f"{r['state_dtype']:>9} {r['round_trips']:>7} {_fmt(r['o_rel_l2']):>10} "
                     f"{_fmt(r['state_rel_l2']):>12}")
    p = result["overflow_probe"]
    lines.append(f"overflow probe (v x {c['v_scale_probe']:g}, weak decay, {p['tokens']} tokens): "
                 f"max|S| fp32 = {p['max_abs_state_fp32']:.3g}; "
                 + "; ".join(f"{d}: {overflow_text(p[d])}" for d in ("bfloat16", "float16")))
    return "\n".join(lines + chain)
