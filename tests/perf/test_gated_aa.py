"""Timing only the rows the gates read (``kernel-lab bench --gated-only``), the A/A pairs of those rows,
and each gate's false-alarm rate written into the gates file, per machine."""
from __future__ import annotations

import difflib
import json
import tomllib
import weakref

import numpy as np
import pytest

from bench import baselines, gates, machine, registry, run
from tests.cli_in_process import main

registry.load()
GPU_BENCHES = [n for n, b in registry.benches().items() if b.device == "gpu"]


def test_gated_rows_are_exactly_what_the_gates_read():
    gate_list = gates.load()
    rows = run.gated_rows(gate_list, GPU_BENCHES)
    timed = {f"{bench}/{shape}/{impl}" for bench, shapes in rows.items() for shape, impls in shapes.items()
             for impl in impls}
    read = {ref for g in gate_list if g.benches <= set(GPU_BENCHES) for ref in (g.numerator, g.denominator)}
    assert timed == read
    # a GPU bench is timed shape by shape, each with only the implementations its gates read
    calls = run._rows_of("turboquant/decode", rows)
    assert (["L=8192,act=float16"], ["gpu-copy", "gpu-copy-eager"]) in calls
    assert all("gpu-matmul-bf16" not in impls for _, impls in calls)
    # a CPU bench is one interleaved call over every row named
    cpu = run._rows_of("gdn/decode", run.gated_rows(gate_list, ["gdn/decode"]))
    assert len(cpu) == 1 and set(cpu[0][0]) == {"state=float32", "state=bfloat16", "state=float16"}
    assert run.gated_rows(gate_list, ["gdn/chunked-gpu"]) == {
        "gdn/chunked-gpu": {"T=8192,state=bfloat16": ["triton-gdn", "fla"],
                            "varlen=4x2048,state=bfloat16": ["triton-gdn", "fla"]}}


# two gates of bench/gates.toml as they were before any A/A, and a third that the writes below leave alone
UNMEASURED = """
[[gate]]
name = "tq-decode-L8192-vs-sdpa"
description = "GPU TurboQuant decode, portable Triton, L=8192: at most 1.2x torch SDPA on a bf16 cache"
numerator = "turboquant/decode/L=8192/triton-grouped"
denominator = "turboquant/decode/L=8192/torch-sdpa"
quantity = "time"
direction = "<="
threshold = 1.2
requires = ["gpu"]
false_alarm_rate = "not measured"

[[gate]]
name = "gdn-gpu-decode-N32-bf16-vs-copy"
description = "GPU GDN decode, N=32, bf16 state: at least 0.7 of the copy rate"
numerator = "gdn/decode-gpu/N=32,state=bfloat16/gpu-copy"
denominator = "gdn/decode-gpu/N=32,state=bfloat16/triton-gdn-sm90"
quantity = "time"
direction = ">="
threshold = 0.7
requires = ["sm_90"]
false_alarm_rate = "not measured"

[[gate]]
name = "gdn-gpu-decode-N32-fp16-vs-copy"
description = "GPU GDN decode, N=32, fp16 state: at least 0.7 of the copy rate"
numerator = "gdn/decode-gpu/N=32,state=float16/gpu-copy"
denominator = "gdn/decode-gpu/N=32,state=float16/triton-gdn-sm90"
quantity = "time"
direction = ">="
threshold = 0.7
requires = ["sm_90"]
false_alarm_rate = "0/40"
measured_on = "h200"
false_alarm_rates = { "h200" = "0/40" }
"""


def test_rates_written_per_machine_and_nothing_else_changed():
    text = UNMEASURED
    once = gates.with_rates(text, {"tq-decode-L8192-vs-sdpa": ("1/40", "h200"),
                                   "gdn-gpu-decode-N32-bf16-vs-copy": ("0/40", "h200")})
    twice = gates.with_rates(once, {"tq-decode-L8192-vs-sdpa": ("3/40", "h100-80gb-hbm3")})
    edits = [line for line in difflib.ndiff(text.splitlines(), twice.splitlines()) if line[:2] in ("+ ", "- ")]
    assert sorted(edits) == sorted(['- false_alarm_rate = "not measured"'] * 2 + [
        '+ false_alarm_rate = "3/40"', '+ measured_on = "h100-80gb-hbm3"',
        '+ false_alarm_rates = { "h100-80gb-hbm3" = "3/40", "h200" = "1/40" }',
        '+ false_alarm_rate = "0/40"', '+ measured_on = "h200"', '+ false_alarm_rates = { "h200" = "0/40" }'])
    loaded = {g["name"]: g for g in tomllib.loads(twice)["gate"]}
    before = {g["name"]: g for g in tomllib.loads(text)["gate"]}
    for name, g in before.items():
        if name not in ("tq-decode-L8192-vs-sdpa", "gdn-gpu-decode-N32-bf16-vs-copy"):
            assert loaded[name] == g
    tq = gates._gate(loaded["tq-decode-L8192-vs-sdpa"])
    assert tq.false_alarm_rates == {"h200": "1/40", "h100-80gb-hbm3": "3/40"}
    assert tq.rate_on("h200") == ("1/40", "h200") and tq.rate_on("h100-80gb-hbm3") == ("3/40", "h100-80gb-hbm3")
    assert tq.rate_on("mi355x") == ("3/40", "h100-80gb-hbm3")   # elsewhere: the last one written, named
    with pytest.raises(ValueError, match="not in the file: no-such-gate"):
        gates.with_rates(text, {"no-such-gate": ("0/40", "h200")})


def test_a_block_without_rate_lines_gets_them_before_its_blank_line():
    text = ('[[gate]]\nname = "g"\nnumerator = "b/s/x"\ndenominator = "b/s/y"\nquantity = "time"\n'
            'direction = "<="\nthreshold = 1.0\n\n[[gate]]\nname = "h"\nnumerator = "b/s/x"\n'
            'denominator = "b/s/y"\nquantity = "time"\ndirection = "<="\nthreshold = 2.0\n')
    out = gates.with_rates(text, {"g": ("2/40", "h200")})
    assert out.split("\n\n")[0].endswith('threshold = 1.0\nfalse_alarm_rate = "2/40"\nmeasured_on = "h200"\n'
                                         'false_alarm_rates = { "h200" = "2/40" }')
    assert out.split("\n\n")[1] == text.split("\n\n")[1]


def test_judge_reports_the_rate_of_the_machine_it_ran_on():
    gate = gates.Gate(name="t", numerator="b/s/slow", denominator="b/s/fast", quantity="time", direction=">=",
                      threshold=1.5, false_alarm_rate="9/40", measured_on="elsewhere",
                      false_alarm_rates={"here": "1/40", "elsewhere": "9/40"})
    import numpy as np
    from bench.measure import Record

    def rec(rid, key, s):
        return Record(rid, {"fingerprint": {"key": key}}, samples=np.array(s))
    here = gates.judge(gate, {"b/s/slow": rec("b/s/slow", "here", [2.0] * 3), "b/s/fast": rec("b/s/fast", "here", [1.0] * 3)})
    assert here["verdict"] == "pass" and (here["false_alarm_rate"], here["measured_on"]) == ("1/40", "here")
    other = gates.judge(gate, {"b/s/slow": rec("b/s/slow", "new", [2.0] * 3), "b/s/fast": rec("b/s/fast", "new", [1.0] * 3)})
    assert (other["false_alarm_rate"], other["measured_on"]) == ("9/40", "elsewhere")


def test_saving_some_benches_keeps_the_saved_run_of_the_others(tmp_path):
    def perf(bench, rid):
        return {"benchmarks": [{"name": rid, "extra_info": {"bench": bench}}], "skipped": []}
    baselines.save("m", perf("gdn/chunked-gpu", "gdn/chunked-gpu/T/x"),
                   {"date": "d1", "load": "l1", "records": {"gdn/chunked-gpu/T/x": {"ratios": [1.0]}},
                    "gates": {"g1": {}}}, base=tmp_path)
    baselines.save("m", perf("turboquant/decode", "turboquant/decode/L/y"),
                   {"date": "d2", "load": "l2", "records": {"turboquant/decode/L/y": {"ratios": [1.1]}},
                    "gates": {"g2": {}}}, base=tmp_path)
    saved = json.loads((tmp_path / "m" / "perf.json").read_text())
    noise = json.loads((tmp_path / "m" / "noise.json").read_text())
    assert [b["name"] for b in saved["benchmarks"]] == ["gdn/chunked-gpu/T/x", "turboquant/decode/L/y"]
    assert set(noise["records"]) == {"gdn/chunked-gpu/T/x", "turboquant/decode/L/y"} and set(noise["gates"]) == {"g1", "g2"}
    assert noise["measured"] == {"gdn/chunked-gpu": {"date": "d1", "load": "l1"},
                                 "turboquant/decode": {"date": "d2", "load": "l2"}}
    # measuring a bench again replaces its own entries
    baselines.save("m", perf("gdn/chunked-gpu", "gdn/chunked-gpu/T/z"), None, base=tmp_path)
    saved = json.loads((tmp_path / "m" / "perf.json").read_text())
    assert [b["name"] for b in saved["benchmarks"]] == ["turboquant/decode/L/y", "gdn/chunked-gpu/T/z"]


def test_aa_of_the_gated_rows_writes_the_rates_into_the_gates_file(tmp_path, monkeypatch, capsys):
    """The A/A path end to end on a CPU gate, with 2 pairs (the GPU gates take the same code)."""
    import optimized.cpu as cpu

    built, why = cpu.extension_status()
    if not built:
        pytest.skip(why)
    gate = {g.name: g for g in gates.load()}["gdn-decode-bf16-vs-fp32"]
    missing = [w for w in map(gates.missing_capability, gate.requires) if w]
    if missing:
        pytest.skip("; ".join(missing))
    lines = gates.GATES_TOML.read_text().split("[[gate]]")
    one = next(block for block in lines if f'name = "{gate.name}"' in block)
    gates_file = tmp_path / "gates.toml"
    gates_file.write_text("[[gate]]" + one)
    monkeypatch.setattr(baselines, "MIN_PAIRS", 2)
    rc, out, err = main(capsys, "bench", "--bench", "gdn/decode", "--gated-only", "--aa", "2", "--write-gates",
                        "--gates", gates_file, "--baselines", tmp_path / "bl", "--load", "test")
    assert rc == 0, err
    key = machine.fingerprint("cpu")["key"]
    written = gates._gate(tomllib.loads(gates_file.read_text())["gate"][0])
    rate = written.false_alarm_rates[key]
    assert written.measured_on == key and rate.endswith("/4") and rate == written.false_alarm_rate
    assert f"{gate.name}" in out and f"false alarms {rate}" in out
    noise = json.loads((tmp_path / "bl" / key / "noise.json").read_text())
    saved = json.loads((tmp_path / "bl" / key / "perf.json").read_text())
    assert set(noise["records"]) == {gate.numerator, gate.denominator}   # only the rows the gate reads
    assert {b["name"] for b in saved["benchmarks"]} == {gate.numerator, gate.denominator}
    assert noise["gates"][gate.name]["false_alarm_rate"] == rate


def _toy_gpu_bench(monkeypatch, counts):
    """A GPU bench "toy/gpu" with one shape and three rows, run on the CPU: ``bench.timing``'s capture (a
    replay that, like a CUDA graph's, fails once the captured call is no longer held), eager warm-up and
    samples replaced by counters, each sample the value the row's call returns (seconds):
    ``steady`` 2 ms, ``fast`` 1 ms (timed as eager calls), ``wobbly`` 1 and 3 ms in turn for 5 samples (its
    gate straddles), then 3 ms for 5 (measured again, it passes)."""
    from bench import timing
    from bench.registry import Bench, Impl
    from conformance.cost import Cost

    def inputs(shape):
        counts["inputs"] += 1
        return {}

    def prepare(seconds):
        def prep(shape, x):
            counts["prepare"] += 1
            turn = iter(seconds * 1000)
            return lambda: next(turn)
        return prep

    def counted(name, fn):
        counts[name] += 1
        return fn

    def graph_replay(fn):
        """Like a CUDA graph's replay: it holds no reference to the tensors the call allocated, so it fails
        once nothing else holds the call."""
        held = weakref.ref(fn)

        def replay():
            call = held()
            if call is None:
                raise RuntimeError("replay of a captured call nothing holds: its tensors are freed")
            return call()
        return replay

    bench = Bench(name="toy/gpu", device="gpu", shapes={"s": {}}, cost=lambda shape: Cost(bytes=1, flops=1),
                  inputs=inputs, reps=5)
    impls = {"steady": Impl("toy/gpu", "steady", "ours", prepare([2e-3])),
             "fast": Impl("toy/gpu", "fast", "ours", prepare([1e-3]), timing="events"),
             "wobbly": Impl("toy/gpu", "wobbly", "ours", prepare([1e-3, 3e-3, 1e-3, 3e-3, 1e-3] + [3e-3] * 5))}
    monkeypatch.setitem(registry._BENCHES, bench.name, bench)
    monkeypatch.setitem(registry._IMPLS, bench.name, impls)
    monkeypatch.setattr(timing, "capture", lambda fn: counted("capture", graph_replay(fn)))
    monkeypatch.setattr(timing, "eager", lambda fn: counted("eager", fn))
    monkeypatch.setattr(timing, "samples", lambda fn, reps: counted("samples", np.array([fn() for _ in range(reps)])))


def test_aa_sets_each_row_up_once_and_times_it_in_every_run(tmp_path, monkeypatch, capsys):
    """2 pairs of a GPU bench's gated rows: inputs built once per shape, each call prepared and captured once
    for the whole A/A, timed in each of the 4 runs, and a straddling gate measured again from the same set-ups."""
    counts = dict.fromkeys(("inputs", "prepare", "capture", "eager", "samples"), 0)
    _toy_gpu_bench(monkeypatch, counts)
    gates_file = tmp_path / "gates.toml"
    gates_file.write_text(
        '[[gate]]\nname = "toy-steady"\nnumerator = "toy/gpu/s/steady"\ndenominator = "toy/gpu/s/fast"\n'
        'quantity = "time"\ndirection = ">="\nthreshold = 1.5\n\n'
        '[[gate]]\nname = "toy-wobbly"\nnumerator = "toy/gpu/s/wobbly"\ndenominator = "toy/gpu/s/fast"\n'
        'quantity = "time"\ndirection = ">="\nthreshold = 2.0\n')
    monkeypatch.setattr(baselines, "MIN_PAIRS", 2)
    rc, out, err = main(capsys, "bench", "--bench", "toy/gpu", "--gated-only", "--aa", "2", "--write-gates",
                        "--gates", gates_file, "--baselines", tmp_path / "bl", "--load", "test")
    assert rc == 0, err
    # per row: 10 ms of warm-up and 5 samples of 30 + 5 ms, in 4 runs
    assert "A/A plan: 2 pairs x 3 rows, about 2 s of GPU timing" in out
    assert ", captures included\n" in out and " s for the 2 runs left\n" in out   # the estimate from the steady run
    assert counts == {"inputs": 1, "prepare": 3, "capture": 2, "eager": 1,
                      "samples": 4 * 3 * 2}   # each run: the 3 rows, then again for the straddling gate
    written = {g.name: g for g in gates.load(gates_file)}
    key = machine.fingerprint("gpu")["key"]
    assert written["toy-steady"].false_alarm_rates == written["toy-wobbly"].false_alarm_rates == {key: "0/4"}
    noise = json.loads((tmp_path / "bl" / key / "noise.json").read_text())
    assert noise["gates"]["toy-wobbly"]["remeasured"] == 4 and noise["gates"]["toy-steady"]["remeasured"] == 0
    assert set(noise["records"]) == {"toy/gpu/s/steady", "toy/gpu/s/fast", "toy/gpu/s/wobbly"}
    # a normal run sets every shape up afresh
    run.measure_all(["toy/gpu"])
    assert counts["prepare"] == 6 and counts["samples"] == 4 * 3 * 2 + 3


def test_gpu_samples_warm_up_once_per_row_and_a_normal_run_times_like_the_aa(monkeypatch):
    """``timing.samples``: ``WARMUP_MS`` before the first sample only, each sample over ``SAMPLE_MS``; the
    plan's row time counts them."""
    import triton.testing

    from bench import timing

    calls = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, return_mode: calls.append((warmup, rep, return_mode)) or 2.0)
    assert list(timing.samples(lambda: None, 5)) == [2e-3] * 5
    assert calls == [(timing.WARMUP_MS, timing.SAMPLE_MS, "median")] + [(0, timing.SAMPLE_MS, "median")] * 4
    assert (timing.WARMUP_MS, timing.SAMPLE_MS) == (10, 30)
    assert timing.gpu_row_seconds(5) == pytest.approx((10 + 5 * (30 + timing.SAMPLE_OVERHEAD_MS)) / 1e3)


_TOY_GATE = ('[[gate]]\nname = "toy-steady"\nnumerator = "toy/gpu/s/steady"\ndenominator = "toy/gpu/s/fast"\n'
             'quantity = "time"\ndirection = ">="\nthreshold = 1.5\n')


class _Cut(Exception):
    """The call ends (the device call's time limit) in the middle of an A/A."""


def test_an_aa_cut_short_continues_from_its_journaled_pairs(tmp_path, monkeypatch, capsys):
    """An A/A of 3 pairs cut in its third pair keeps the 2 finished pairs; the next call of the same A/A measures
    only the third, and its noise holds all 3; the journal is gone once they are saved."""
    from bench import timing

    counts = dict.fromkeys(("inputs", "prepare", "capture", "eager", "samples"), 0)
    _toy_gpu_bench(monkeypatch, counts)
    fake = timing.samples

    def cut_in_the_fifth_run(fn, reps):
        if counts["samples"] == 4 * 2:   # 2 pairs of 2 runs of its 2 rows
            raise _Cut
        return fake(fn, reps)
    monkeypatch.setattr(timing, "samples", cut_in_the_fifth_run)
    gates_file = tmp_path / "gates.toml"
    gates_file.write_text(_TOY_GATE)
    monkeypatch.setattr(baselines, "MIN_PAIRS", 3)
    args = ("bench", "--bench", "toy/gpu", "--gated-only", "--aa", "3", "--gates", gates_file,
            "--baselines", tmp_path / "bl", "--load", "test")
    with pytest.raises(_Cut):
        main(capsys, *args)
    key = machine.fingerprint("gpu")["key"]
    journal = tmp_path / "bl" / key / baselines.JOURNAL
    assert len(journal.read_text().splitlines()) == 1 + 2   # the identity, then a line per finished pair
    capsys.readouterr()
    monkeypatch.setattr(timing, "samples", fake)
    rc, out, err = main(capsys, *args)
    assert rc == 0, err
    assert "A/A plan: 1 pairs x 2 rows" in out and "2 of the 3 pairs were measured before" in out
    assert counts["samples"] == 4 * 2 + 2 * 2   # the first call's 4 runs, then the third pair's 2
    noise = json.loads((tmp_path / "bl" / key / "noise.json").read_text())
    assert noise["records"]["toy/gpu/s/steady"]["pairs"] == 3
    assert noise["gates"]["toy-steady"]["false_alarm_rate"] == "0/6"
    assert not journal.exists()


def test_an_aa_of_other_code_or_another_machine_starts_over(tmp_path, monkeypatch, capsys):
    """A journal written for another machine key (or other code, rows, gates) is not continued: it is removed,
    the call says so and measures every pair."""
    counts = dict.fromkeys(("inputs", "prepare", "capture", "eager", "samples"), 0)
    _toy_gpu_bench(monkeypatch, counts)
    gates_file = tmp_path / "gates.toml"
    gates_file.write_text(_TOY_GATE)
    monkeypatch.setattr(baselines, "MIN_PAIRS", 2)
    args = ("bench", "--bench", "toy/gpu", "--gated-only", "--aa", "2", "--gates", gates_file,
            "--baselines", tmp_path / "bl", "--load", "test")
    monkeypatch.setenv(baselines.VARIABLE, str(tmp_path / "bl"))
    key = machine.fingerprint("gpu")["key"]
    journal = baselines.journal_path([key])
    rows = run.gated_rows(gates.load(gates_file), ["toy/gpu"])
    ran = list(run.measure_all(["toy/gpu"], rows=rows).values())
    pair = (ran, ran)
    for other, field in (({"machines": {"gpu": "h100-80gb-hbm3"}}, "machines"), ({"code": "0" * 16}, "code")):
        identity = {**baselines.aa_identity({"gpu": key}, ["toy/gpu"], rows, gates.load(gates_file)), **other}
        baselines.journal(journal, identity, pair, {"toy-steady": [["pass", 2.0, ""], ["pass", 2.0, ""]]})
        counts["samples"] = 0
        rc, out, err = main(capsys, *args)
        assert rc == 0, err
        assert f"{journal} held pairs measured with other {field}" in out and "starting over" in out
        assert "A/A plan: 2 pairs x 2 rows" in out and counts["samples"] == 4 * 2
        assert not journal.exists()
