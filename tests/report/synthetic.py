"""Synthetic run folders and perf JSON for the report's tests: the shapes of real records (ids,
params, outputs, tolerance, quality) with made-up numbers, clearly not results of any kernel."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

FAMILIES = {
    "gdn": {"ops": ("chunked", "decode", "recurrent", "spec_decode", "gating"),
            "axes": {"state": ("float32", "bfloat16", "float16"), "H": (2, 4, 16), "K": (64, 128),
                     "lens": ("1", "63+129", "4096"), "decay": ("weak", "strong", "zero")},
            "outputs": ("o", "state")},
    "turboquant": {"ops": ("store", "decode", "store_decode"),
                   "axes": {"preset": ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"),
                            "layout": ("aos", "soa"), "Hk": (1, 4, 8), "bs": (16, 32, 64), "L": (1, 257, 8192)},
                   "outputs": ("out",)},
}
BACKENDS = ("numpy-ref", "jax-ref", "cpu-avx512", "cpu-scalar", "triton", "triton-grouped", "peer-vllm", "peer-fla")
UNAVAILABLE = {"flydsl-gfx950": "no ROCm GPU visible to torch"}


def _record(rng: random.Random, family: str, op: str, params: dict, backend: str, seed: int) -> dict:
    cid = "/".join([family, op] + [f"{k}={v}" for k, v in params.items()] + [f"seed={seed}"])
    base = {"id": cid, "family": family, "op": op, "params": params, "seed": seed, "backend": backend,
            "rounding_model": "exact" if backend.endswith("-ref") else "bf16-operands"}
    u = rng.random()
    if u < 0.12:
        return {**base, "status": "skip", "reason": f"{backend} does not implement {family}/{op}", "duration_s": 0.0}
    status = "pass" if u < 0.95 else rng.choice(("fail", "error", "crash", "xfail", "xpass"))
    outputs = {}
    for name in FAMILIES[family]["outputs"]:
        passed = status in ("pass", "xpass")
        margin = 10 ** rng.uniform(-4, 0.05) if passed else 10 ** rng.uniform(0.1, 2)
        outputs[name] = {"max_abs": margin * 1e-3, "max_rel": margin * 2e-3, "rel_l2": margin * 1e-4,
                         "cosine": 1 - margin * 1e-8, "mismatch": 0.0 if margin <= 1 else 0.01,
                         "margin": min(margin, 1.0) if passed else margin, "nonfinite": 0,
                         "size": 4096, "passed": passed}
    worst = max(outputs.values(), key=lambda m: m["margin"])
    reason = "" if status == "pass" else f"synthetic {status}: o beyond atol + rtol (margin {worst['margin']:.3g})"
    return {**base, "status": status, "reason": reason, "metrics": {k: v for k, v in worst.items() if k != "passed"},
            "outputs": outputs,
            "tolerance": {"atol": 0.0, "rtol": 3.9e-3, "max_mismatch": 0.0, "rel_l2": None,
                          "source": f"synthetic: bf16 rounding of the {family} state, 2 u per write-back"},
            "quality": {"o_rel_l2_vs_fp32_state": worst["rel_l2"] * 3}, "duration_s": rng.uniform(0.001, 2.0)}


def make_run(path: Path, n_records: int, seed: int = 0, finished: bool = True) -> list[dict]:
    """A run folder of about ``n_records`` records over BACKENDS (plus one unavailable backend)."""
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    combos = []
    for family, spec in FAMILIES.items():
        for op in spec["ops"]:
            for values in itertools.product(*spec["axes"].values()):
                combos.append((family, op, dict(zip(spec["axes"], values))))
    rng.shuffle(combos)
    per_cell = len(BACKENDS) + len(UNAVAILABLE)
    recs = []
    for i in range(max(1, n_records // per_cell)):
        family, op, params = combos[i % len(combos)]
        for b in BACKENDS:
            recs.append(_record(rng, family, op, params, b, i // len(combos)))
        for b, why in UNAVAILABLE.items():
            recs.append({**_record(rng, family, op, params, b, i // len(combos)), "status": "skip",
                         "reason": f"backend unavailable: {why}", "unavailable": why, "duration_s": 0.0})
    (path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    info = {"cpu": {"model": "synthetic CPU", "flags": ["avx512f"], "cores": 2}, "gpus": [],
            "versions": {"python": "3.11"}, "git": {"commit": "0" * 40, "dirty": False},
            "command": ["kernel-lab", "conform", "--tier", "full"], "tier": "full", "started": "2026-12-01T00:00:00",
            "backends": {**{b: {"available": True, "reason": "synthetic", "ops": {f: list(s["ops"]) for f, s in FAMILIES.items()}}
                            for b in BACKENDS},
                         **{b: {"available": False, "reason": why, "ops": {}} for b, why in UNAVAILABLE.items()}}}
    if finished:
        info.update(finished="2026-12-01T01:00:00", elapsed_s=3600.0)
    (path / "run.json").write_text(json.dumps(info))
    return recs


def _bench(bench, impl, role, bytes_, flops, median, ceilings):
    t = {"min": median * 0.97, "median": median, "max": median * 1.05, "n": 20}
    gbps, tflops = bytes_ / median / 1e9, flops / median / 1e12
    frac = {k: (gbps / c["gbps"] if "gbps" in c else tflops / c["tflops"]) for k, c in ceilings.items()}
    return {"name": f"test_{bench.replace('/', '_')}[{impl}]", "stats": {"median": median},
            "extra_info": {"bench": bench, "impl": impl, "role": role, "shape": {"B": 8, "L": 8192},
                           "bytes": bytes_, "flops": flops, "time_s": t, "timing": "cpu-interleaved",
                           "gbps": gbps, "tflops": tflops, "ceilings": ceilings, "fraction_of": frac,
                           "fingerprint": {"cpu": "synthetic"}}}


def make_perf(path: Path, slowdown: float = 1.0) -> dict:
    """A perf JSON in the kernel-lab schema: ours, a peer, a baseline and two ceilings, two gates."""
    ceilings = {"cpu-rmw-stream": {"gbps": 40.0}, "amx-bf16": {"tflops": 2.0}}
    chunk_ceilings = {**ceilings, "cpu-rmw-stream": {"gbps": 44.0}}  # each bench measures at its own size
    data = {"benchmarks": [
        _bench("gdn/decode", "cpu-avx512", "ours", 64 << 20, 1 << 28, 2.0e-3 * slowdown, ceilings),
        _bench("gdn/decode", "peer-vllm", "peer", 64 << 20, 1 << 28, 2.6e-3, ceilings),
        _bench("gdn/chunked", "cpu-amx", "ours", 32 << 20, 1 << 33, 9.0e-3, chunk_ceilings),
        _bench("gdn/chunked", "torch-eager", "baseline", 32 << 20, 1 << 33, 30e-3, chunk_ceilings),
        {"name": "test_old_style_benchmark", "stats": {"median": 1e-3}, "extra_info": {"ms": 1.0}}],
        "kernel_lab_gates": [
            {"gate": "gdn-decode-bf16-vs-rmw", "numerator": "gdn/decode cpu-avx512", "denominator": "cpu-rmw-stream",
             "ratio": 0.81, "threshold": 0.7, "direction": ">=", "verdict": "pass", "spread": [0.78, 0.84],
             "remeasured": False, "false_alarm_rate": "0/20", "reason": ""},
            {"gate": "gdn-decode-vs-peer", "numerator": "cpu-avx512", "denominator": "peer-vllm",
             "ratio": 0.99, "threshold": 1.0, "direction": "<=", "verdict": "ambiguous", "spread": [0.95, 1.04],
             "remeasured": True, "false_alarm_rate": "1/20", "reason": "spread straddles the threshold"}]}
    path.write_text(json.dumps(data))
    return data
