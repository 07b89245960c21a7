"""Saved runs per machine fingerprint, the regression gates against them, and their A/A noise.

``baselines/<key>/perf.json``: a saved run (the perf JSON of ``bench.run``) of the machine
whose fingerprint key is ``<key>`` (``bench.machine``). ``noise.json`` beside it: per record id the
ratios of A/A pairs (the same code measured twice in a row, at least 20 pairs), the regression
threshold derived from them (the largest A/A slowdown plus 5%, at least 1.05) and the false-alarm
rate at that threshold; ``aa-pairs.jsonl`` there while an A/A is unfinished: the pairs measured so
far, which the next A/A of the same code, machine, rows and gates continues. A regression gate
compares a record's time with the saved run of the same key only: ``current / saved <= threshold``.
Saved runs are data, not part of the package: they are read from and written to ``baselines/``
under the current folder (the repository's, run from its root), or the folder
``$KERNEL_LAB_BASELINES`` names.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from bench.gates import RATE_KEYS, point_time
from bench.measure import Record

BASELINES = Path("baselines")   # under the current folder
VARIABLE = "KERNEL_LAB_BASELINES"
MIN_PAIRS = 20
GATED_ROLES = ("ours", "baseline", "peer")
JOURNAL = "aa-pairs.jsonl"
SOURCES = ("reference", "planner", "optimized", "conformance", "bench")   # the packages whose code is timed


def root() -> Path:
    """Where saved runs are read and written: ``$KERNEL_LAB_BASELINES`` (``kernel-lab bench
    --baselines DIR`` sets it), else ``baselines/`` under the current folder."""
    return Path(os.environ.get(VARIABLE) or BASELINES)


def folder(key: str, base: Path | None = None) -> Path:
    return (base or root()) / key


def saved(key: str) -> dict[str, dict]:
    """{record id: extra_info} of the saved run of ``key``; {} when there is none."""
    path = folder(key) / "perf.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {b["name"]: b["extra_info"] for b in data["benchmarks"]}


def noise(key: str) -> dict[str, dict]:
    path = folder(key) / "noise.json"
    return json.loads(path.read_text())["records"] if path.exists() else {}


def _saved_point(info: dict) -> float:
    t = info["time_s"]
    return t["min"] if info["timing"] == "cpu-interleaved" else t["median"]


def regression(rec: Record, remeasure=None) -> dict | None:
    """The regression gate of one record against the saved run of its machine (None for
    ceilings and skipped records). Verdicts and remeasurement as in ``bench.gates``."""
    info = rec.extra_info
    if rec.skip is not None or info["role"] not in GATED_ROLES:
        return None
    key = info["fingerprint"]["key"]
    base = {"gate": f"regress:{rec.rid}", "numerator": rec.rid, "denominator": f"saved:{key}",
            "ratio": None, "threshold": None, "direction": "<=", "verdict": "skip", "spread": None,
            "remeasured": False, "false_alarm_rate": "not measured", "measured_on": key,
            "description": "no slower than this machine's saved run, beyond its A/A noise", "reason": ""}
    old = saved(key).get(rec.rid)
    if old is None:
        return {**base, "reason": f"no saved run of {rec.rid} under {folder(key)}/"}
    n = noise(key).get(rec.rid)
    if n is None:
        return {**base, "reason": f"no A/A noise for {rec.rid} in {folder(key)}/noise.json"}
    base.update(threshold=n["threshold"], false_alarm_rate=n["false_alarm_rate"])

    def measured(r: Record):
        """(point time over the saved one, [that ratio, median time over the saved point]); a
        single GPU point gives a zero-width spread."""
        value = point_time(r) / _saved_point(old)
        return value, [value, float(np.median(r.samples)) / _saved_point(old)]

    value, spread = measured(rec)
    if not spread[0] < n["threshold"] < spread[1]:
        return {**base, "ratio": value, "spread": spread, "verdict": "pass" if value <= n["threshold"] else "fail"}
    if remeasure is None:
        return {**base, "ratio": value, "spread": spread, "verdict": "ambiguous",
                "reason": f"close: spread straddles {n['threshold']}"}
    value2, spread2 = measured(remeasure(rec.rid))
    return {**base, "ratio": value2, "spread": spread2, "remeasured": True,
            "verdict": "pass" if value2 <= n["threshold"] else "fail",
            "reason": f"close: first ratio {value:.3f}, spread straddled; decided on the second measurement"}


def aa_noise(pairs: list[tuple[list[Record], list[Record]]], load: str) -> dict:
    """noise.json content from A/A pairs of runs: per record id the ratios B/A of the point times;
    the first half of the pairs sets the threshold (their largest slowdown + 5%, at least 1.05)
    and the false-alarm rate is counted on the second half, which the threshold has not seen (a
    rate counted on the pairs that set it would be zero by construction)."""
    if len(pairs) < MIN_PAIRS:
        raise ValueError(f"pairs: expected at least {MIN_PAIRS} A/A pairs, got {len(pairs)}")
    ratios: dict[str, list[float]] = {}
    for a_run, b_run in pairs:
        a = {r.rid: r for r in a_run if r.skip is None}
        for r in b_run:
            if r.skip is None and r.rid in a and r.extra_info["role"] in GATED_ROLES:
                ratios.setdefault(r.rid, []).append(point_time(r) / point_time(a[r.rid]))
    return {"date": datetime.date.today().isoformat(), "load": load,
            "records": {rid: held_out_threshold(rs) for rid, rs in ratios.items()}}


def held_out_threshold(ratios: list[float]) -> dict:
    """Threshold from the first half of A/A ratios, false-alarm rate on the second half."""
    fit, held = ratios[: len(ratios) // 2], ratios[len(ratios) // 2:]
    threshold = max(1.05, math.ceil(max(fit) * 1.05 * 100) / 100)
    fails = sum(x > threshold for x in held)
    return {"pairs": len(ratios), "ratios": [round(x, 4) for x in ratios], "threshold": threshold,
            "false_alarm_rate": f"{fails}/{len(held)}"}


def _bench_of(rid: str) -> str:
    return rid.rsplit("/", 2)[0]


def merged(old_perf: dict | None, old_noise: dict | None, perf_json: dict, noise_json: dict | None) -> tuple[dict, dict | None]:
    """The saved run and noise after a run of some benches: the new entries of the benches it
    measured (records, skipped records, A/A ratios, in-run gates), the old entries of every other
    bench kept (a run of the gated rows of one bench leaves the others' saved runs as they were);
    ``measured`` says per bench when and under which load its noise was recorded."""
    benches = {_bench_of(x["name"]) for x in perf_json["benchmarks"] + perf_json.get("skipped", [])}
    perf = dict(perf_json)
    if old_perf:
        perf["benchmarks"] = [b for b in old_perf.get("benchmarks", []) if _bench_of(b["name"]) not in benches] \
            + perf_json["benchmarks"]
        perf["skipped"] = [x for x in old_perf.get("skipped", []) if _bench_of(x["name"]) not in benches] \
            + perf_json.get("skipped", [])
    if noise_json is None:
        return perf, None
    noise = {**noise_json, "measured": {**(old_noise or {}).get("measured", {}),
                                        **{b: {"date": noise_json["date"], "load": noise_json["load"]} for b in benches}}}
    if old_noise:
        noise["records"] = {**{r: n for r, n in old_noise.get("records", {}).items() if _bench_of(r) not in benches},
                            **noise_json["records"]}
        noise["gates"] = {**old_noise.get("gates", {}), **noise_json.get("gates", {})}
    return perf, noise


def save(key: str, perf_json: dict, noise_json: dict | None = None, base: Path | None = None) -> Path:
    """Write the saved run (and the A/A noise) of ``key`` under ``base`` (default ``root()``),
    merged with what is saved there (``merged``)."""
    d = folder(key, base)
    d.mkdir(parents=True, exist_ok=True)
    read = lambda name: json.loads((d / name).read_text()) if (d / name).exists() else None  # noqa: E731
    perf, noise = merged(read("perf.json"), read("noise.json"), perf_json, noise_json)
    (d / "perf.json").write_text(json.dumps(perf, indent=1) + "\n")
    if noise is not None:
        (d / "noise.json").write_text(json.dumps(noise, indent=1) + "\n")
    return d


def code_digest() -> str:
    """The first 16 hex digits of the sha256 of the lab's sources (every ``.py``, ``.cpp`` and ``.h`` of the
    packages ``SOURCES``, path and bytes): which code an A/A's journaled pairs were measured with."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".cpp", ".h") and path.is_file():
                h.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def aa_identity(machines: dict[str, str], benches: list[str], rows: dict | None, gate_list: list) -> dict:
    """What the journaled pairs of an A/A share with the A/A that continues them: the code (``code_digest``)
    and package versions, the machine key per device, the benches and rows timed, the gates judged (their
    rates aside)."""
    from conformance.fingerprint import versions

    return {"code": code_digest(), "versions": versions(), "machines": machines, "benches": benches, "rows": rows,
            "gates": [{k: v for k, v in g.__dict__.items() if k not in RATE_KEYS} for g in gate_list]}


def journal_path(keys: list[str]) -> Path:
    """The journal of an unfinished A/A on the machines ``keys``: ``aa-pairs.jsonl`` in their folder (one
    key: that machine's; CPU and GPU benches together: ``<cpu key>+<gpu key>``)."""
    return folder("+".join(sorted(set(keys)))) / JOURNAL


def _record_json(r: Record) -> dict:
    return {"rid": r.rid, "extra_info": r.extra_info, "skip": r.skip,
            "samples": None if r.samples is None else [float(x) for x in r.samples]}


def _record(d: dict) -> Record:
    return Record(d["rid"], d["extra_info"], None if d["samples"] is None else np.array(d["samples"]), d["skip"])


def journal(path: Path, identity: dict, pair: tuple[list[Record], list[Record]], verdicts: dict) -> None:
    """Append one finished A/A pair (its two runs' records, and per gate the two runs' [verdict, ratio,
    reason]) to the journal ``path``, whose first line is ``identity`` (written with the first pair)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [] if path.exists() else [json.dumps({"identity": identity})]
    lines.append(json.dumps({"pair": [[_record_json(r) for r in run] for run in pair], "verdicts": verdicts}))
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


def journaled(path: Path, identity: dict) -> tuple[list[tuple[list[Record], list[Record]]], list[dict],
                                                    str | None]:
    """(pairs, their verdicts, None) journaled at ``path`` for ``identity``; ([], [], why) when the journal
    was written for another identity (its code, machine keys, rows or gates differ: it is removed) and
    ([], [], None) when there is none. A last line cut short (the call ended while writing it) is left out."""
    if not path.exists():
        return [], [], None
    lines = path.read_text().splitlines()
    try:
        theirs = json.loads(lines[0])["identity"]
    except (IndexError, ValueError, KeyError, TypeError):
        theirs = {}
    mine = json.loads(json.dumps(identity))
    differ = [k for k in mine if theirs.get(k) != mine[k]]
    if differ:
        path.unlink()
        return [], [], f"{path} held pairs measured with other {', '.join(differ)}: removed, starting over"
    pairs, verdicts = [], []
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            break
        pairs.append(tuple([_record(d) for d in run] for run in entry["pair"]))
        verdicts.append(entry["verdicts"])
    return pairs, verdicts, None
