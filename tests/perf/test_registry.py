"""The benchmark registry and the gate logic: cost models against figures recorded elsewhere,
registration and capability checks, verdicts on made-up records, and on real measurements a
deliberately slowed implementation (registered here only: four decodes per call; under a load
average of 10-14 on this 2-vCPU machine the fp32/bf16 ratio reaches 2.7, so a 2x slowdown can
still pass the 1.3x gate) that fails its gate and an A/A pair
(the same kernel under two names) that passes."""
from __future__ import annotations

import numpy as np
import pytest

from bench import baselines, gates, machine, measure, registry
from conformance.families.gdn import cost as gdn_cost
from conformance.families.turboquant import cost as tq_cost
from bench.gdn_cpu import HEADS

registry.load()


def test_turboquant_cost_matches_the_recorded_h200_bytes():
    # ledger/h200/tq_decode_variants.json recorded tq_bytes 281018368 at L=8192 (cache only)
    shape = dict(B=32, Hk=8, G=8, D=128, L=8192, preset="turboquant_4bit_nc")
    assert tq_cost.decode(shape).bytes == 281018368 + 2 * 2 * 32 * 64 * 128


def test_gdn_costs_scale_with_state_dtype_and_chunks():
    fp32 = gdn_cost.decode(dict(N=128, **HEADS, state_dtype="float32"))
    bf16 = gdn_cost.decode(dict(N=128, **HEADS, state_dtype="bfloat16"))
    assert fp32.bytes - bf16.bytes == 2 * 128 * 32 * 128 * 128 * 2 and fp32.flops == bf16.flops
    one = gdn_cost.chunked(dict(lens=[8192], **HEADS, state_dtype="bfloat16"))
    four = gdn_cost.chunked(dict(lens=[2048] * 4, **HEADS, state_dtype="bfloat16"))
    assert one.flops == four.flops == 128 * 32 * (6 * 64 * 64 * 128 + 4 * 64 * 64 * 128 + 6 * 64 * 128 * 128)


def test_spec_decode_cost_reads_the_state_once_and_stores_it_per_draft_token():
    from bench import gpu_ceilings
    from bench.gdn_gpu import SPEC_BENCH, spec_tables

    def shape(T, state):
        return dict(N=32, T=T, **HEADS, state_dtype=state)
    state = 32 * 32 * 128 * 128
    io = 2 * 32 * (2 * 16 * 128 + 2 * 32 * 128 + 2 * 32)   # q, k, v, o, a, b of one token per sequence
    for T in (2, 4):
        for name, size in (("float32", 4), ("bfloat16", 2)):
            c = gdn_cost.spec_decode(shape(T, name))
            assert c.bytes == (1 + T) * size * state + T * io and c.flops == 7 * T * state, (T, name)
    impls = registry.impls(SPEC_BENCH)
    for label, s in registry.benches()[SPEC_BENCH].shapes.items():
        op = gdn_cost.spec_decode(s).bytes
        ceiling = impls["gpu-copy"].cost(s).bytes   # the fan-out: its source read once, written T times
        assert 0 <= ceiling - op < (1 + s["T"]) * gpu_ceilings.COPY_ALIGN, label
        assert 0 <= impls["gpu-copy-eager"].cost(s).bytes - op < 2 * gpu_ceilings.COPY_ALIGN, label
    spec, acc, cu = spec_tables(16, 4)
    assert sorted(spec.flatten().tolist()) == list(range(64)) and spec.shape == (16, 4)
    assert acc.min() >= 1 and acc.max() <= 4 and cu.tolist() == list(range(0, 65, 4))
    with pytest.raises(ValueError, match="copies"):
        gpu_ceilings.triton_fanout(1 << 16, 0)


def _noop(shape, inputs):
    return lambda: None


def test_registration_refuses_duplicates_unknown_benches_and_roles():
    with pytest.raises(ValueError, match="already has"):
        registry.register_impl(registry.Impl(bench="gdn/decode", name="cpu", role="ours", prepare=_noop))
    with pytest.raises(ValueError, match="no bench named"):
        registry.register_impl(registry.Impl(bench="gdn/nope", name="x", role="ours", prepare=_noop))
    with pytest.raises(ValueError, match="role"):
        registry.Impl(bench="gdn/decode", name="x", role="hero", prepare=_noop)


def test_capability_says_why_an_impl_is_disabled():
    def boom():
        raise RuntimeError("driver gone")
    off = registry.Impl(bench="gdn/decode", name="off", role="peer", prepare=_noop,
                        available=lambda: (False, "peer package is not installed"))
    broken = registry.Impl(bench="gdn/decode", name="broken", role="peer", prepare=_noop, available=boom)
    small = registry.Impl(bench="gdn/decode", name="small", role="peer", prepare=_noop,
                          supports=lambda s: None if s["N"] < 64 else "only batches under 64")
    shape = registry.benches()["gdn/decode"].shapes["state=float32"]
    assert registry.capability(off, shape) == "peer package is not installed"
    assert "raised RuntimeError: driver gone" in registry.capability(broken, shape)
    assert registry.capability(small, shape) == "only batches under 64"
    with registry.registered(off):
        recs = {r.rid: r for r in measure.measure("gdn/decode", ["state=float32"], ["off"])}
    assert recs["gdn/decode/state=float32/off"].skip == "peer package is not installed"
    assert "off" not in registry.impls("gdn/decode")


def test_the_sm90_decode_is_enabled_only_on_compute_capability_9_0_and_16_bit_activations(monkeypatch):
    import torch

    from bench import turboquant_gpu
    # Imported before TRITON_INTERPRET goes: Gluon's import asserts that Triton's standard library
    # matches the interpreter setting Triton saw when it was first imported in this process.
    import optimized.triton.tq_decode_sm90  # noqa: F401

    monkeypatch.setattr(turboquant_gpu, "gpu_capability", lambda: (True, "a test GPU"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    impl = registry.impls("turboquant/decode")["triton-sm90"]
    shapes = registry.benches()["turboquant/decode"].shapes
    for cc, why in (((9, 0), None), ((8, 0), "compute capability 9.0"), ((10, 0), "got 10.0")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
        got = registry.capability(impl, shapes["L=8192"])
        assert got is None if why is None else why in got, (cc, got)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert registry.capability(impl, shapes["L=8192,act=float16"]) is None
    assert "bfloat16 or float16 queries" in turboquant_gpu.sm90_supports(dict(shapes["L=8192"], act="float32"))


def test_every_gpu_copy_ceiling_is_checked_against_an_eager_copy_in_the_same_run():
    from bench import gpu_ceilings

    impls = registry.impls("turboquant/decode")
    assert impls["gpu-copy"].timing == "cuda-graph" and impls["gpu-copy-eager"].timing == "events"
    with pytest.raises(ValueError, match="timing"):
        registry.Impl(bench="gdn/decode", name="x", role="ceiling", prepare=_noop, timing="wall")
    by_pair = {(g.numerator, g.denominator, g.direction): g.threshold for g in gates.load()}
    for label, shape in registry.benches()["turboquant/decode"].shapes.items():
        pair = (f"turboquant/decode/{label}/gpu-copy", f"turboquant/decode/{label}/gpu-copy-eager")
        assert by_pair[(*pair, ">=")] == 0.95 and by_pair[(*pair, "<=")] == 1.05, label
        c = tq_cost.decode(shape).bytes
        assert impls["gpu-copy"].cost(shape).bytes == impls["gpu-copy-eager"].cost(shape).bytes == \
            2 * gpu_ceilings.copy_bytes(c) and 0 <= gpu_ceilings.copy_bytes(c) - c < gpu_ceilings.COPY_ALIGN


def _record(rid: str, seconds) -> measure.Record:
    seconds = np.asarray(seconds, float)
    return measure.Record(rid, {"time_s": {"min": float(seconds.min()), "median": float(np.median(seconds)),
                                           "max": float(seconds.max()), "n": len(seconds)},
                                "timing": "cpu-interleaved", "bytes": 100, "flops": 0}, samples=seconds)


GATE = gates.Gate(name="t", numerator="b/s/slow", denominator="b/s/fast", quantity="time", direction=">=",
                  threshold=1.5)


def test_verdicts_pass_fail_skip():
    recs = {"b/s/slow": _record("b/s/slow", [2.0, 2.1, 2.2]), "b/s/fast": _record("b/s/fast", [1.0, 1.0, 1.05])}
    assert gates.judge(GATE, recs)["verdict"] == "pass"
    assert gates.judge(gates.Gate(**{**GATE.__dict__, "threshold": 2.5}), recs)["verdict"] == "fail"
    missing = gates.judge(gates.Gate(**{**GATE.__dict__, "denominator": "b/s/peer"}), recs)
    assert missing["verdict"] == "skip" and "b/s/peer" in missing["reason"]
    lacking = gates.judge(gates.Gate(**{**GATE.__dict__, "requires": ("no_such_cpu_flag",)}), recs)
    assert lacking == {**lacking, "verdict": "skip", "reason": "this CPU lacks no_such_cpu_flag"}


def test_a_straddling_spread_is_measured_again_and_called_close():
    recs = {"b/s/slow": _record("b/s/slow", [1.2, 1.4, 1.7, 1.9]), "b/s/fast": _record("b/s/fast", [1.0] * 4)}
    assert gates.judge(GATE, recs)["verdict"] == "ambiguous"
    calls = []

    def remeasure(g):
        calls.append(g.name)
        return {"b/s/slow": _record("b/s/slow", [1.3, 1.35, 1.4]), "b/s/fast": _record("b/s/fast", [1.0] * 3)}
    r = gates.judge(GATE, recs, remeasure)
    assert calls == ["t"] and r["remeasured"] and r["verdict"] == "fail" and r["reason"].startswith("close")
    # a repeat that straddles again cannot decide: it stays ambiguous and says why
    again = gates.judge(GATE, recs, lambda g: recs)
    assert again["verdict"] == "ambiguous" and again["reason"].startswith("too noisy to decide")


def _decode_four_times(shape, inputs):
    import optimized.cpu as cpu

    def run():
        for _ in range(4):
            cpu.gdn_decode(**inputs["args"], state=inputs["state"], num_threads=shape["threads"])
    return run


def test_slowed_impl_fails_its_gate_and_an_aa_pair_passes():
    import optimized.cpu as cpu

    built, why = cpu.extension_status()
    if not built:
        pytest.skip(why)
    ours = registry.impls("gdn/decode")["cpu"]
    slowed = registry.Impl(bench="gdn/decode", name="cpu-slowed", role="ours", prepare=_decode_four_times,
                           available=ours.available)
    twin = registry.Impl(bench="gdn/decode", name="cpu-twin", role="ours", prepare=ours.prepare,
                         available=ours.available)
    gate = {g.name: g for g in gates.load()}["gdn-decode-bf16-vs-fp32"]
    missing = [why for why in map(gates.missing_capability, gate.requires) if why]
    if missing:
        pytest.skip(f"{gate.name}: {'; '.join(missing)}")
    slow_gate = gates.Gate(**{**gate.__dict__, "denominator": gate.denominator.replace("/cpu", "/cpu-slowed")})
    # the A/A pair is held to this machine's measured regression noise for the record (1.3 elsewhere)
    noise = baselines.noise(machine.fingerprint("cpu")["key"]).get("gdn/decode/state=bfloat16/cpu")
    aa_gate = gates.Gate(name="aa", numerator="gdn/decode/state=bfloat16/cpu-twin",
                         denominator="gdn/decode/state=bfloat16/cpu", quantity="time", direction="<=",
                         threshold=noise["threshold"] if noise else 1.3)
    with registry.registered(slowed, twin):
        recs = {r.rid: r for r in measure.measure("gdn/decode", ["state=float32", "state=bfloat16"],
                                                  ["cpu", "cpu-slowed", "cpu-twin"], reps=5)}

        def again(g):
            return {r.rid: r for r in measure.measure("gdn/decode", ["state=float32", "state=bfloat16"],
                                                      ["cpu", "cpu-slowed", "cpu-twin"], reps=5)}
        slow = gates.judge(slow_gate, recs, again)
        aa = gates.judge(aa_gate, recs, again)
    assert slow["verdict"] == "fail", slow
    assert aa["verdict"] == "pass", aa


def test_a_peer_that_raises_is_a_skip_with_the_exception():
    def broken(shape, inputs):
        def call():
            raise RuntimeError("schema mismatch")
        return call
    peer = registry.Impl(bench="gdn/decode", name="raising-peer", role="peer", prepare=broken)
    with registry.registered(peer):
        recs = {r.rid: r for r in measure.measure("gdn/decode", ["state=bfloat16"], ["raising-peer"], reps=1)}
    assert recs["gdn/decode/state=bfloat16/raising-peer"].skip == "raising-peer raised RuntimeError: schema mismatch"


def _timed(rid: str, seconds, role="ours", key="test-machine") -> measure.Record:
    rec = _record(rid, seconds)
    rec.extra_info.update(role=role, bench=rid.rsplit("/", 2)[0], fingerprint={"key": key})
    return rec


def test_regression_gate_against_the_saved_run_of_the_same_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(baselines, "BASELINES", tmp_path)
    rid = "gdn/decode/state=float32/cpu"
    pairs = [([_timed(rid, [1.0, 1.1])], [_timed(rid, [1.0 + 0.01 * i, 1.2])]) for i in range(20)]
    noise = baselines.aa_noise(pairs, load="test")
    # ratios 1.00 .. 1.19: the first ten set 1.15 (1.09 x 1.05), four of the held-out ten exceed it
    assert noise["records"][rid]["threshold"] == 1.15 and noise["records"][rid]["false_alarm_rate"] == "4/10"
    assert baselines.held_out_threshold([1.0, 1.02] * 10)["false_alarm_rate"] == "0/10"
    with pytest.raises(ValueError, match="at least 20"):
        baselines.aa_noise(pairs[:19], load="test")
    assert "no saved run" in baselines.regression(_timed(rid, [1.0]))["reason"]
    saved = {"benchmarks": [{"name": rid, "extra_info": _timed(rid, [1.0, 1.1]).extra_info}]}
    baselines.save("test-machine", saved, noise)
    assert baselines.regression(_timed(rid, [1.1, 1.2]))["verdict"] == "pass"
    assert baselines.regression(_timed(rid, [1.5, 1.6]))["verdict"] == "fail"
    other = baselines.regression(_timed(rid, [1.5, 1.6], key="other-machine"))
    assert other["verdict"] == "skip" and "other-machine" in other["reason"]
    assert baselines.regression(_timed(rid, [1.0], role="ceiling")) is None
