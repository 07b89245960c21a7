"""Read perf JSON: pytest-benchmark's ``--benchmark-json`` whose benchmarks carry kernel-lab's
``extra_info`` (bench, impl, role, shape, bytes, flops, time_s, gbps, tflops, ceilings,
fraction_of) and a top-level ``kernel_lab_gates`` list, or ``gates.json`` (the gate list alone).

Benchmarks without that ``extra_info`` (written before it existed) are kept apart with their
pytest-benchmark median, so the page can say what each lacks instead of guessing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED = ("bench", "impl", "role", "time_s")


@dataclass
class Perf:
    path: Path
    benchmarks: list[dict] = field(default_factory=list)   # kernel-lab rows
    other: list[dict] = field(default_factory=list)        # {name, median_s, missing}
    gates: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def ceilings(self) -> tuple[dict[str, dict], list[str]]:
        """Ceiling name -> {"gbps": f} or {"tflops": f}, the highest value measured, and one note
        per ceiling measured with several values (each benchmark measures its ceilings at its own
        size, so they differ; each row's fraction uses its own)."""
        seen: dict[str, list[dict]] = {}
        for b in self.benchmarks:
            for name, c in (b.get("ceilings") or {}).items():
                seen.setdefault(name, []).append(c)
        out, notes = {}, []
        for name, values in seen.items():
            unit = "gbps" if "gbps" in values[0] else "tflops"
            nums = [v[unit] for v in values if unit in v]
            out[name] = {unit: max(nums)}
            if min(nums) != max(nums):
                label = "GB/s" if unit == "gbps" else "TFLOP/s"
                notes.append(f"{name} was measured at each benchmark's own size: {min(nums):.4g} to "
                             f"{max(nums):.4g} {label}; the roofline draws the highest")
        return out, notes


def _described(gate_results: list[dict]) -> list[dict]:
    """Gate results with the gates file's ``description`` and ``measured_on`` where a file
    written before they were recorded lacks them (matched by gate name)."""
    from bench import gates

    known = {g.name: g for g in gates.load()}
    out = []
    for r in gate_results:
        g = known.get(r.get("gate"))
        out.append({"description": g.description if g else "", "measured_on": g.measured_on if g else "", **r})
    return out


def load(path: str | Path) -> Perf:
    """One perf JSON; ValueError naming ``--perf`` when the file is missing or not JSON."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"--perf {path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ValueError(f"--perf {path}: not JSON ({exc})") from None
    perf = Perf(p)
    if isinstance(data, list):  # gates.json
        perf.gates = _described(data)
        return perf
    if not isinstance(data, dict):
        raise ValueError(f"--perf {path}: expected pytest-benchmark JSON or a gate list")
    perf.gates = _described(data.get("kernel_lab_gates") or [])
    for b in data.get("benchmarks") or []:
        extra = b.get("extra_info") or {}
        missing = [k for k in REQUIRED if k not in extra]
        if missing:
            perf.other.append({"name": b.get("name", "?"), "median_s": (b.get("stats") or {}).get("median"),
                               "missing": missing, "extra_info": extra})
        else:
            perf.benchmarks.append({**extra, "name": b.get("name", "?")})
    return perf
