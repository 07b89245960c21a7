"""The sm_90 GDN decode (``optimized.triton.gdn_decode_sm90``) on an sm_90 GPU: checks, then timings.

Checks (``checks``): the Qwen3-Next heads (N=32, H=16, HV=32, K=V=128) for every pool dtype x activation
dtype, and random shapes (N, H, G = HV / H, padding slots, l2 norm off, a given scale, A_log in another dtype),
each against ``reference.gdn.numpy_ref.decode`` computed in float64, beside today's portable kernel
(``gdn_recurrent.decode``) on the same inputs. The pool is a view into a buffer with a guard slot before and
after it and slots no sequence uses; o is poisoned (NaN) before the call. Bounds (the ``exact`` rounding
model, the terms of ``conformance.families.gdn.tolerances``' gdn.fp32, per element): |o - o_ref| <= 8 sqrt(K)
u32 T_o + max(u_act |o_ref|, half the subnormal spacing) + u32 |o_ref| (o rounded once to the activation
dtype, the oracle's o once to float32); a float32 pool |S - S_ref| <= 8 sqrt(K) u32 T_S; a 16-bit pool that
plus one ulp per element (at least the subnormal spacing), and at most E + 8 sqrt(E) + 8 elements off (tie
flips; E the expected count, sum of min(1, sqrt(K) u32 T_S / ulp)); guard and unused slots bit-identical;
padding rows 0.
T_o = a |S|^T |q| + beta (|q|.|k|) (|v| + a |S|^T |k|), T_S = a |S| + beta |k| (|v| + a |S|^T |k|)^T,
a = exp(g) (1 + |g|). ``planted``: the same checks on outputs with a planted bug (a truncating bf16 store,
key heads tiled instead of repeated, a padding slot written) must fail; it runs without a GPU too.

Timings: the registry's ``gdn/decode-gpu`` bench (CUDA-graph medians) with ours (``triton-gdn``), the sm_90
decode (``triton-gdn-sm90``) and its tile variants (registered for this run only), FLA where installed,
and the copy ceilings. Writes ``gdn_decode_sm90.json`` (checks, planted, perf-JSON records):
``python -m bench.probes.gdn_decode_sm90 --out DIR [--planted-only] [--shapes LABEL ...] [--variants NAME ...]``.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

U32 = 2.0 ** -24
UNIT = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
SPACING = {"float32": 2.0 ** -149, "bfloat16": 2.0 ** -133, "float16": 2.0 ** -24}  # between subnormals
DTYPES = ("float32", "bfloat16", "float16")
# staged: the states through a ring of two shared-memory stages by cp.async (both value heads of a program in
# flight at its start, no registers held); ring<S>-p: a persistent grid, each program streaming its items' heads
# through a ring of S stages (S heads always in flight); -r168: at most 168 registers a thread, three programs a
# multiprocessor for a 16-bit pool (ptxas 13 spills about 200 bytes a thread there)
VARIANTS = {"l8": dict(lanes_k=8), "l16": dict(lanes_k=16), "p-l16": dict(prefetch=True, lanes_k=16),
            "staged": dict(stages=2), "ring2-p": dict(stages=2, persistent=True),
            "ring3-p": dict(stages=3, persistent=True), "ring2-p-r168": dict(stages=2, persistent=True, registers=168)}


# ---------------------------------------------------------------- cases and the reference

def case(seed: int, N: int, H: int, HV: int, state: str, act: str, pad: int = 0, l2norm: bool = True,
         scale=None, a_log: str = "float32", extra_slots: int = 3) -> dict:
    """Host inputs (NumPy; activations already rounded to ``act``) of one decode: a pool of N + extra slots in
    ``state``, ``pad`` sequences on slot -1."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    K = V = 128
    narrow = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

    def act_rows(*shape, s=1.0):
        return (s * rng.standard_normal(shape)).astype(np.float32).astype(narrow[act]).astype(np.float32)

    qk_scale = 1.0 if l2norm else K ** -0.5
    slots = N + extra_slots
    idx = rng.permutation(slots)[:N].astype(np.int32)
    idx[rng.permutation(N)[:pad]] = -1
    return dict(q=act_rows(N, H, K, s=qk_scale), k=act_rows(N, H, K, s=qk_scale), v=act_rows(N, HV, V),
                A_log=(0.5 * rng.standard_normal(HV)).astype(np.float32).astype(narrow[a_log]).astype(np.float32),
                a=act_rows(N, HV), b=act_rows(N, HV), dt_bias=act_rows(HV, s=0.5),
                state=(0.5 * rng.standard_normal((slots, HV, K, V))).astype(np.float32).astype(narrow[state]),
                state_indices=idx, act=act, a_log=a_log, l2norm=l2norm, scale=scale)


def reference(c: dict) -> dict:
    """o, the stored pool, the float32-pool state (the exact update before a 16-bit rounding) and the
    magnitudes T_o [N, HV, V], T_S [N, HV, K, V] (float32; by sequence, 0 for padding) of ``c``."""
    from reference.gdn import numpy_ref as ref

    args = [c[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")]
    kw = dict(scale=c["scale"], use_qk_l2norm=c["l2norm"], l2norm_eps=1e-6, compute_dtype="float64")
    pool = c["state"].copy()
    o = ref.decode(*args, pool, c["state_indices"], state_dtype=c["state"].dtype.name, **kw)
    pool32 = c["state"].astype(np.float32)
    ref.decode(*args, pool32, c["state_indices"], state_dtype="float32", **kw)
    HV = c["v"].shape[1]
    qs, ks = ref.prepare_qk(c["q"], c["k"], HV, c["scale"], c["l2norm"], 1e-6, np.dtype(np.float64))
    g, beta = (np.asarray(x, np.float64) for x in ref.gating(c["A_log"], c["a"], c["b"], c["dt_bias"],
                                                              compute_dtype="float64"))
    T_o = np.zeros(c["v"].shape)
    T_S = np.zeros(c["v"].shape[:2] + c["state"].shape[2:], np.float32)
    for n, slot in enumerate(c["state_indices"]):
        if slot < 0:
            continue
        al = (np.exp(g[n]) * (1 + np.abs(g[n])))[:, None]
        S = np.abs(c["state"][slot].astype(np.float64))
        u = np.abs(c["v"][n]) + al * np.einsum("hkv,hk->hv", S, np.abs(ks[n]))
        T_o[n] = al * np.einsum("hkv,hk->hv", S, np.abs(qs[n])) + (beta[n] * np.sum(np.abs(qs[n] * ks[n]), -1))[:, None] * u
        T_S[n] = al[:, :, None] * S + (beta[n][:, None, None] * np.abs(ks[n])[:, :, None]) * u[:, None, :]
    return dict(o=o, pool=pool, pool32=pool32, T_o=T_o, T_S=T_S)


# ---------------------------------------------------------------- the bounds

def check(c: dict, r: dict, o, pool, buffer_before=None, buffer_after=None) -> dict:
    """The bounds of the module docstring for a kernel's ``o`` (float32 NumPy) and ``pool`` (state dtype) against
    ``reference(c)``; guard bytes when the buffers around the pool are given. ``ok`` and the margins (largest
    error over its bound, flips over the allowed count)."""
    K = c["q"].shape[2]
    real = c["state_indices"] >= 0
    written = c["state_indices"][real]
    res = {}
    # the kernel's fp32 error, its rounding of o to the activation dtype (half a spacing among subnormals), the
    # oracle's rounding of its o to float32
    bound_o = (8 * np.sqrt(K) * U32 * r["T_o"] + np.maximum(UNIT[c["act"]] * np.abs(r["o"]), SPACING[c["act"]] / 2)
               + U32 * np.abs(r["o"]) + 1e-30)
    err_o = np.abs(o - r["o"])
    res["o_margin"] = float(np.nanmax(np.where(real[:, None, None], err_o / bound_o, 0.0), initial=0.0))
    res["o_nan"] = int(np.isnan(o).sum())
    res["padding_rows_nonzero"] = int(np.count_nonzero(o[~real]))
    sd = c["state"].dtype.name
    got = pool[written].astype(np.float64)
    T_S = r["T_S"][real].astype(np.float64)
    fp32_bound = 8 * np.sqrt(K) * U32 * T_S + 1e-30
    if sd == "float32":
        res["state_margin"] = float(np.max(np.abs(got - r["pool32"][written]) / fp32_bound, initial=0.0))
        res["flips"], res["flips_allowed"] = 0, 0
    else:
        want = r["pool"][written].astype(np.float64)
        ulp = np.maximum(2 * UNIT[sd] * np.maximum(np.abs(want), np.abs(got)), SPACING[sd])
        res["state_margin"] = float(np.max(np.abs(got - want) / (fp32_bound + ulp + 1e-30), initial=0.0))
        expected = float(np.sum(np.minimum(1.0, np.sqrt(K) * U32 * T_S / (ulp + 1e-30))))
        res["flips"] = int(np.count_nonzero(got != want))
        res["flips_allowed"] = int(expected + 8 * np.sqrt(expected) + 8)
    unused = np.setdiff1d(np.arange(c["state"].shape[0]), written)
    res["unused_slots_changed"] = int(np.count_nonzero(
        pool[unused].view(np.uint8) != c["state"][unused].view(np.uint8)))
    if buffer_before is not None:
        res["guard_bytes_changed"] = int(np.count_nonzero(buffer_before != buffer_after))
    res["ok"] = bool(res["o_margin"] <= 1 and res["state_margin"] <= 1 and res["flips"] <= res["flips_allowed"]
                     and res["o_nan"] == 0 and res["padding_rows_nonzero"] == 0 and res["unused_slots_changed"] == 0
                     and res.get("guard_bytes_changed", 0) == 0)
    return res


def planted() -> dict:
    """The checks on reference outputs with a planted bug, each of which must fail (and the unplanted
    reference, which must pass): a truncating bf16 store, key heads tiled (hv % H) instead of repeated, a
    padding slot's pool written, a float32 pool stored through bf16."""
    import ml_dtypes

    from reference.gdn import numpy_ref as ref

    c = case(7, 16, 2, 4, "bfloat16", "bfloat16", pad=3)
    r = reference(c)
    out = {"unplanted": check(c, r, r["o"], r["pool"])}
    bits = r["pool32"].view(np.uint32) >> 16
    truncated = r["pool"].copy()
    live = c["state_indices"][c["state_indices"] >= 0]
    truncated[live] = bits[live].astype(np.uint16).view(ml_dtypes.bfloat16)
    out["truncating-store"] = check(c, r, r["o"], truncated)
    tiled = [hv % 2 for hv in range(4)]  # value head hv reads key head hv % H instead of hv // G
    o_tiled = ref.decode(c["q"][:, tiled], c["k"][:, tiled], *[c[n] for n in ("v", "A_log", "a", "b", "dt_bias")],
                         c["state"].copy(), c["state_indices"], state_dtype="bfloat16", compute_dtype="float64")
    out["head-mapping-tiled"] = check(c, r, o_tiled, r["pool"])
    pad_written = r["pool"].copy()
    unused = np.setdiff1d(np.arange(c["state"].shape[0]), live)
    pad_written[unused[0]] = 0
    out["padding-slot-written"] = check(c, r, r["o"], pad_written)
    c32 = case(8, 16, 2, 4, "float32", "bfloat16", pad=3)
    r32 = reference(c32)
    through_bf16 = r32["pool32"].astype(ml_dtypes.bfloat16).astype(np.float32)
    out["unplanted float32 pool"] = check(c32, r32, r32["o"], r32["pool32"])
    out["float32-state-through-bf16"] = check(c32, r32, r32["o"], through_bf16)
    out["ok"] = all(out[n]["ok"] for n in out if n.startswith("unplanted")) and not any(
        out[n]["ok"] for n in out if not n.startswith("unplanted"))
    return out


# ---------------------------------------------------------------- on the GPU

def run_kernel(fn, c: dict, **kw) -> tuple:
    """``fn`` (a decode launcher) on device copies of ``c``, the pool a view between guard slots of a larger
    buffer: (o as float32 NumPy, pool, buffer bytes before, buffer bytes after)."""
    import torch

    from conformance.torch_arrays import to_numpy, to_torch

    dev = "cuda"
    st = c["state"]
    slot = int(np.prod(st.shape[1:]))
    buf = to_torch(np.concatenate([np.random.default_rng(1).standard_normal(slot).astype(np.float32).astype(st.dtype),
                                   st.reshape(-1),
                                   np.random.default_rng(2).standard_normal(slot).astype(np.float32).astype(st.dtype)]),
                   dev)
    before = to_numpy(buf).view(np.uint8).copy()
    pool = buf[slot:slot + st.size].view(st.shape)
    act = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[c["act"]]
    t = {n: torch.from_numpy(c[n]).to(dev, act) for n in ("q", "k", "v", "a", "b", "dt_bias")}
    A_log = torch.from_numpy(c["A_log"]).to(dev, {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                                   "float16": torch.float16}[c["a_log"]])
    out = torch.full(c["v"].shape, float("nan"), dtype=act, device=dev)
    fn(t["q"], t["k"], t["v"], A_log, t["a"], t["b"], t["dt_bias"], pool,
       torch.from_numpy(c["state_indices"]).to(dev), scale=c["scale"], use_qk_l2norm=c["l2norm"], out=out, **kw)
    torch.cuda.synchronize()
    after = to_numpy(buf).view(np.uint8)
    n0, n1 = slot * st.itemsize, (slot + st.size) * st.itemsize
    guards = (np.concatenate([before[:n0], before[n1:]]), np.concatenate([after[:n0], after[n1:]]))
    return to_numpy(out.float()), to_numpy(pool), guards[0], guards[1]


def cases() -> list[tuple[str, dict]]:
    """(label, case): Qwen3-Next's heads for every pool x activation dtype, then random shapes."""
    out = [(f"qwen3-next N=32 state={s} act={a}", case(10 + i, 32, 16, 32, s, a, pad=3))
           for i, (s, a) in enumerate((s, a) for s in DTYPES for a in DTYPES)]
    rng = np.random.default_rng(2026)
    for i in range(12):
        N, H, G = int(rng.integers(1, 40)), int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 3, 4, 8]))
        s, a = str(rng.choice(DTYPES)), str(rng.choice(DTYPES))
        kw = dict(pad=int(rng.integers(0, N // 3 + 1)), l2norm=bool(i % 3), scale=None if i % 2 else 0.05,
                  a_log=str(rng.choice(DTYPES)))
        out.append((f"random N={N} H={H} G={G} state={s} act={a} " + " ".join(f"{k}={v}" for k, v in kw.items()),
                    case(100 + i, N, H, H * G, s, a, **kw)))
    return out


def checks(variants, on_row=None) -> list[dict]:
    """Every case through the sm_90 decode (default and the named ``variants``) and today's kernel;
    ``on_row(rows)`` after each case (the rows so far)."""
    from optimized.triton import gdn_decode_sm90, gdn_recurrent

    rows = []
    for label, c in cases():
        r = reference(c)
        row = {"case": label}
        sm90_o = sm90_pool = None
        for name, fn, kw in [("sm90", gdn_decode_sm90.decode, {}), ("today", gdn_recurrent.decode, {})] + [
                (f"sm90-{v}", gdn_decode_sm90.decode, VARIANTS[v]) for v in variants]:
            try:
                o, pool, b0, b1 = run_kernel(fn, c, **kw)
                row[name] = check(c, r, o, pool, b0, b1)
                if name == "sm90":
                    sm90_o, sm90_pool = o, pool
                elif name == "today" and sm90_o is not None:
                    row["same_as_today"] = {"o_bits": float(np.mean(sm90_o == o)),
                                            "state_bits": float(np.mean(sm90_pool == pool))}
            except Exception as exc:  # one case's failure does not hide the others
                row[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
        print(f"{label:90} " + " ".join(
            f"{k}:{'ok' if v['ok'] else 'FAIL'}" + (f"(o {v['o_margin']:.2f} S {v['state_margin']:.2f} flips "
                                                    f"{v['flips']}/{v['flips_allowed']})" if "o_margin" in v else "")
            for k, v in row.items() if isinstance(v, dict) and "ok" in v), flush=True)
        if on_row is not None:
            on_row(rows)
    return rows


def _runs(config: dict):
    """``Impl.supports`` of a variant: None when it runs at the shape's dtypes (a decode of 4 sequences, compiled and
    launched here), else the exception, so that a variant that does not build is a skip, not the end of the run."""
    def supports(shape: dict) -> str | None:
        import torch

        from bench.gdn_gpu import decode_inputs, ours_sm90

        small = dict(shape, N=4)
        try:
            ours_sm90(small, decode_inputs(small), **config)()
            torch.cuda.synchronize()
        except Exception as exc:
            return f"{config} raised {type(exc).__name__}: {str(exc)[:300]}"
        return None
    return supports


def timings(shapes, variants) -> dict:
    """The gdn/decode-gpu bench, then the sm_90 ``variants`` (registered for this run) beside the copy ceiling,
    measured again in the same process for their fractions: a variant that faults costs only the variants' rows."""
    from bench import registry
    from bench.gdn_gpu import BENCH, ours_sm90
    from bench.measure import measure
    from bench.registry import Impl
    from bench.turboquant_gpu import sm90_available

    impls = [Impl(bench=BENCH, name=f"triton-gdn-sm90-{n}", role="ours", prepare=functools.partial(ours_sm90, **kw),
                  available=sm90_available, supports=_runs(kw)) for n, kw in VARIANTS.items() if n in variants]
    registry.load()
    records = {r.rid: r for r in measure(BENCH, shapes=shapes)}
    with registry.registered(*impls):
        try:
            again = measure(BENCH, shapes=shapes, impls=["gpu-copy", *(i.name for i in impls)])
            records.update({r.rid: r for r in again if r.rid not in records})
        except Exception as exc:
            print(f"the variants raised {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return records


def table(records: dict) -> str:
    """ms and % of the in-run copy per shape: the sm_90 decode and variants, today's kernel, FLA, the copy."""
    by_shape: dict = {}
    for rid, r in records.items():
        _, _, shape, impl = rid.split("/", 3)
        by_shape.setdefault(shape, {})[impl] = r
    lines = [f"{'shape':36} {'impl':22} {'ms':>8} {'% copy':>7}"]
    for shape, impls in by_shape.items():
        for impl, r in impls.items():
            if r.skip:
                lines.append(f"{shape:36} {impl:22} skip: {r.skip[:60]}")
                continue
            t = r.extra_info["time_s"]
            spread = (t["max"] - t["min"]) / t["median"] * 100
            lines.append(f"{shape:36} {impl:22} {t['median'] * 1e3:8.4f} "
                         f"{100 * r.extra_info['fraction_of'].get('gpu-copy', 0):7.1f}  (spread {spread:.1f}%)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--planted-only", action="store_true", help="only the planted-bug checks (no GPU needed)")
    ap.add_argument("--shapes", nargs="*", help="shape labels of the bench (default all)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                    help="tile variants of the sm_90 decode checked and timed beside its default (default all)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"planted": planted()}
    print("planted:", {n: v["ok"] for n, v in result["planted"].items() if isinstance(v, dict)},
          "->", "ok" if result["planted"]["ok"] else "FAIL", flush=True)
    if not args.planted_only:
        from bench import run

        records = timings(args.shapes, args.variants)  # first: the table is printed again last
        result["perf"] = run.perf_json(records, [])
        print(table(records), flush=True)
        (out / "gdn_decode_sm90.json").write_text(json.dumps(result, indent=1) + "\n")

        def save(rows):   # after each case: a run cut short keeps the cases it checked
            (out / "gdn_decode_sm90.json").write_text(json.dumps({**result, "checks": rows}, indent=1) + "\n")
        result["checks"] = checks(args.variants, save)
        bad = [r["case"] for r in result["checks"] if not all(v["ok"] for v in r.values() if isinstance(v, dict)
                                                               and "ok" in v)]
        print(f"checks: {len(result['checks']) - len(bad)} of {len(result['checks'])} cases pass everywhere"
              + (f"; failing: {bad}" if bad else ""))
        print(table(records))
    else:
        (out / "gdn_decode_sm90_planted.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["planted"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
