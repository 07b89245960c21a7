"""Gates as data (``bench/gates.toml``) and their verdicts.

A gate is ``ratio = value(numerator) / value(denominator)`` of one run, two record ids
``bench/shape/impl`` (an implementation or a ceiling), ``quantity`` "time" (seconds) or "gbps" /
"tflops", compared with ``threshold`` in ``direction`` ("<=" or ">="). Repetitions pair up by
index (the same pass of the interleaved CPU timing, the same sample of GPU timing); the ratio is
the median of the paired ratios (a load that slows both of a pair cancels) and the spread their
interquartile range. Verdicts: ``pass`` / ``fail``;
``ambiguous`` when the spread straddles the threshold, and then the gate is measured once more
and decided on the second measurement, its reason saying it was close; when the second spread
straddles too, the machine was too noisy to decide and the verdict stays ``ambiguous``; ``skip``
with the reason when a capability or an implementation is missing.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import machine
from bench.measure import Record

GATES_TOML = Path(__file__).resolve().parent / "gates.toml"
QUANTITIES = ("time", "gbps", "tflops")


@dataclass(frozen=True)
class Gate:
    name: str
    numerator: str
    denominator: str
    quantity: str
    direction: str
    threshold: float
    requires: tuple = ()
    false_alarm_rate: str = "not measured"
    measured_on: str = ""     # the machine key (bench.machine) where false_alarm_rate was measured
    description: str = ""
    false_alarm_rates: dict = field(default_factory=dict)   # machine key -> its rate "k/N"

    def rate_on(self, key: str | None) -> tuple[str, str]:
        """(false-alarm rate, machine key it was measured on) for a run on machine ``key``: that
        machine's own rate when measured, else the gate's ``false_alarm_rate``."""
        if key in self.false_alarm_rates:
            return self.false_alarm_rates[key], key
        return self.false_alarm_rate, self.measured_on

    def __post_init__(self):
        if self.quantity not in QUANTITIES:
            raise ValueError(f"{self.name}: quantity: expected one of {QUANTITIES}, got {self.quantity!r}")
        if self.direction not in ("<=", ">="):
            raise ValueError(f"{self.name}: direction: expected '<=' or '>=', got {self.direction!r}")

    @property
    def benches(self) -> set[str]:
        return {ref.rsplit("/", 2)[0] for ref in (self.numerator, self.denominator)}

    def quiet(self, min_pairs: int = 20) -> bool:
        """Measured false-alarm rate zero over at least ``min_pairs`` A/A runs."""
        parts = self.false_alarm_rate.split("/")
        return len(parts) == 2 and parts[0] == "0" and parts[1].isdigit() and int(parts[1]) >= min_pairs


def _gate(entry: dict) -> Gate:
    return Gate(**{**entry, "requires": tuple(entry.get("requires", ()))})


def load(path: Path = GATES_TOML) -> list[Gate]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return [_gate(g) for g in data["gate"]]


def missing_capability(req: str) -> str | None:
    """None when this machine has ``req`` (a CPU flag such as avx512_bf16 or amx_bf16, "gpu",
    "sm_90", "gfx950"); else why not."""
    if req in ("gpu", "sm_90", "gfx950"):
        ok, why = machine.gpu_capability()
        if not ok:
            return why
        if req == "gpu":
            return None
        gpu = machine.fingerprint("gpu")["gpu"]
        have = gpu.get("arch") if req == "gfx950" else f"sm_{(gpu.get('compute_capability') or '').replace('.', '')}"
        return None if have and have.startswith(req) else f"needs {req}, this GPU is {have}"
    return None if machine.has_cpu_flag(req) else f"this CPU lacks {req}"


def _value(rec: Record, quantity: str):
    """The record's per-repetition seconds, or GB/s or TFLOP/s over them."""
    if quantity == "time":
        return rec.samples
    info = rec.extra_info
    amount = info["bytes"] if quantity == "gbps" else info["flops"]
    return amount / rec.samples / (1e9 if quantity == "gbps" else 1e12)


def point_time(rec: Record) -> float:
    t = rec.extra_info["time_s"]
    return t["min"] if rec.extra_info["timing"] == "cpu-interleaved" else t["median"]


def ratio(gate: Gate, num: Record, den: Record) -> tuple[float, list[float]]:
    """(median, [q25, q75]) of the paired per-repetition ratios."""
    n = min(len(num.samples), len(den.samples))
    paired = _value(num, gate.quantity)[:n] / _value(den, gate.quantity)[:n]
    q25, q50, q75 = np.quantile(paired, [0.25, 0.5, 0.75])
    return float(q50), [float(q25), float(q75)]


def _passes(gate: Gate, value: float) -> bool:
    return value <= gate.threshold if gate.direction == "<=" else value >= gate.threshold


def _result(gate: Gate, **kw) -> dict:
    return {"gate": gate.name, "numerator": gate.numerator, "denominator": gate.denominator,
            "ratio": None, "threshold": gate.threshold, "direction": gate.direction, "verdict": "skip",
            "spread": None, "remeasured": False, "false_alarm_rate": gate.false_alarm_rate,
            "measured_on": gate.measured_on, "description": gate.description, "reason": "", **kw}


def judge(gate: Gate, records: dict[str, Record], remeasure=None) -> dict:
    """The gate's result dict (the perf-JSON ``kernel_lab_gates`` entry), with the false-alarm rate
    measured on the machine of the run when there is one (``Gate.rate_on``). ``remeasure(gate)``
    returns fresh records for the gate's two ids; without it a straddling spread stays
    ``ambiguous``."""
    here = records.get(gate.numerator)
    rate, on = gate.rate_on(here.extra_info.get("fingerprint", {}).get("key") if here is not None else None)
    return {**_judged(gate, records, remeasure), "false_alarm_rate": rate, "measured_on": on}


def _judged(gate: Gate, records: dict[str, Record], remeasure=None) -> dict:
    for req in gate.requires:
        why = missing_capability(req)
        if why:
            return _result(gate, reason=why)
    for ref in (gate.numerator, gate.denominator):
        rec = records.get(ref)
        if rec is None:
            return _result(gate, reason=f"{ref}: no implementation of that name is registered "
                                         "(peers register in bench/peers/ when their package is installed)")
        if rec.skip is not None:
            return _result(gate, reason=f"{ref}: {rec.skip}")
    value, spread = ratio(gate, records[gate.numerator], records[gate.denominator])
    straddles = spread[0] < gate.threshold < spread[1]
    if not straddles:
        return _result(gate, ratio=value, spread=spread, verdict="pass" if _passes(gate, value) else "fail")
    if remeasure is None:
        return _result(gate, ratio=value, spread=spread, verdict="ambiguous",
                       reason=f"close: spread {spread[0]:.3f}-{spread[1]:.3f} straddles {gate.threshold}")
    fresh = remeasure(gate)
    value2, spread2 = ratio(gate, fresh[gate.numerator], fresh[gate.denominator])
    first = f"first spread {spread[0]:.3f}-{spread[1]:.3f} (ratio {value:.3f}) straddled {gate.threshold}"
    if spread2[0] < gate.threshold < spread2[1]:
        return _result(gate, ratio=value2, spread=spread2, verdict="ambiguous", remeasured=True,
                       reason=f"too noisy to decide: {first}, and so did the second "
                              f"({spread2[0]:.3f}-{spread2[1]:.3f}, ratio {value2:.3f})")
    verdict = "pass" if _passes(gate, value2) else "fail"
    return _result(gate, ratio=value2, spread=spread2, verdict=verdict, remeasured=True,
                   reason=f"close: {first}; decided on the second measurement")


def reading(false_alarm_rate: str) -> str:
    """How far a gate's verdict can be trusted, from its A/A false-alarm rate ``k/N``: ``quiet``
    (0/N), ``noisy`` (0 < k < N: a fail may be noise), ``unmet target`` (N/N: it fails on unchanged
    code every time, a target the code has not met, not a false alarm) or ``not measured``."""
    k, _, n = str(false_alarm_rate).partition("/")
    if not (k.isdigit() and n.isdigit() and int(n) > 0):
        return "not measured"
    return "quiet" if int(k) == 0 else "unmet target" if int(k) == int(n) else "noisy"


def table(results: list[dict]) -> str:
    """One row per gate: gate, ratio, threshold, verdict, spread, the load average and usable cores
    while its records were measured, reason (a text table whose columns fit the longest gate name)."""
    from conformance.run.counts import text_table

    rows = []
    for r in results:
        ratio_s = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        spread = f"{r['spread'][0]:.3f}-{r['spread'][1]:.3f}" if r["spread"] else "-"
        threshold = f"{r['direction']} {r['threshold']:g}" if r["threshold"] is not None else "-"
        verdict = r["verdict"]
        if verdict == "fail" and reading(r.get("false_alarm_rate", "")) == "unmet target":
            verdict = "fail: unmet target"
        load = r.get("load")
        load_s = f"{load['load_1m']:g}/{load['cores']}" if load else "-"
        rows.append([r["gate"], ratio_s, threshold, verdict, spread, load_s, r["reason"]])
    return text_table(["gate", "ratio", "threshold", "verdict", "spread", "load/cores", "reason"], rows,
                      right=(1, 2, 4, 5))


_NAME = re.compile(r'^name\s*=\s*"(.*)"\s*$')
RATE_KEYS = ("false_alarm_rate", "measured_on", "false_alarm_rates")
_RATE_LINE = re.compile(r"^(false_alarm_rate|measured_on|false_alarm_rates)\s*=")


def rate_lines(gate: Gate, rate: str, key: str) -> list[str]:
    """The TOML lines of ``gate`` that say its false-alarm rate ``rate`` measured on machine ``key``
    (beside the rates of other machines it keeps)."""
    table = {**gate.false_alarm_rates, key: rate}
    pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(table.items()))
    return [f"false_alarm_rate = {json.dumps(rate)}", f"measured_on = {json.dumps(key)}",
            f"false_alarm_rates = {{ {pairs} }}"]


def with_rates(text: str, rates: dict[str, tuple[str, str]]) -> str:
    """The gates file ``text`` with, for each gate named in ``rates`` (name -> (rate, machine key)),
    its ``rate_lines`` in place of its old rate lines; every other line kept as it is. ValueError
    when a gate is not in the file, or the result does not read back as the same gates with only
    those rates changed (then nothing should be written)."""
    old = {g["name"]: g for g in tomllib.loads(text)["gate"]}
    missing = sorted(set(rates) - set(old))
    if missing:
        raise ValueError(f"gates not in the file: {', '.join(missing)}")
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == "[[gate]]"] + [len(lines)]
    out = lines[:starts[0]]
    for begin, end in zip(starts, starts[1:]):
        block = lines[begin:end]
        name = next((m.group(1) for m in map(_NAME.match, block) if m), None)
        if name in rates:
            at = next((i for i, line in enumerate(block) if _RATE_LINE.match(line)), None)
            kept = [line for line in block if not _RATE_LINE.match(line)]
            if at is None:   # after the block's last non-blank line
                at = max(i for i, line in enumerate(kept) if line.strip()) + 1
            block = kept[:at] + rate_lines(_gate(old[name]), *rates[name]) + kept[at:]
        out += block
    new_text = "\n".join(out)
    new = {g["name"]: g for g in tomllib.loads(new_text)["gate"]}
    for name, g in old.items():
        same = {k: v for k, v in g.items() if k not in RATE_KEYS} == \
               {k: v for k, v in new.get(name, {}).items() if k not in RATE_KEYS}
        if not same or (name in rates and (new[name]["false_alarm_rate"], new[name]["measured_on"]) != rates[name]):
            raise ValueError(f"{name}: the edited file does not read back as intended")
    return new_text
