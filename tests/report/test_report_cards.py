"""Two cards side by side in the report: runs of different hardware fingerprints (run.json) compared
per (cell, backend), and bench rows per fraction of their in-run ceiling against the A/A noise."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from reports import build, diff
from tests.report import synthetic

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "ledger" / "h200"


def _card(run: Path, name: str) -> None:
    info = json.loads((run / "run.json").read_text())
    info["gpus"] = [{"name": name, "compute_capability": "9.0"}]
    (run / "run.json").write_text(json.dumps(info))


def _flip(run: Path, backend: str, n: int, to: str = "fail") -> list[str]:
    """Make the first ``n`` passing records of ``backend`` in ``run`` ``to``, a failing status with its
    first output failed at margin 2 (a record that agrees with itself); their ids."""
    recs = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    flipped = []
    for r in recs:
        if r["backend"] == backend and r["status"] == "pass" and len(flipped) < n:
            r.update(status=to, reason=f"made {to} on this card")
            if to in ("fail", "xfail") and r.get("outputs"):
                first = next(iter(r["outputs"].values()))
                first.update(passed=False, margin=2.0)
                if r.get("metrics"):
                    r["metrics"]["margin"] = 2.0
            flipped.append(r["id"])
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return flipped


def _perf(path: Path, key: str, slowdown: float = 1.0, gpu: str | None = None) -> None:
    synthetic.make_perf(path, slowdown)
    data = json.loads(path.read_text())
    for b in data["benchmarks"]:
        if "fingerprint" in b.get("extra_info", {}):
            b["extra_info"]["fingerprint"].update(key=key, gpu={"name": gpu})
            b["name"] = f"{b['extra_info']['bench']}/B=8/{b['extra_info']['impl']}"
    path.write_text(json.dumps(data))


def _noise(base: Path, key: str, band: float) -> None:
    (base / key).mkdir(parents=True)
    rid = "gdn/decode/B=8/cpu-avx512"
    (base / key / "noise.json").write_text(json.dumps({"records": {rid: {"ratios": [1.0, band, 1 / band]}}}))


def test_two_cards_side_by_side_in_summary_and_page(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic.make_run(a, 600, seed=3)
    synthetic.make_run(b, 600, seed=3)
    _card(a, "NVIDIA H200")
    _card(b, "NVIDIA H100 80GB HBM3")
    failed_on_b = _flip(b, "triton-grouped", 2)
    passes_on_b_only = _flip(a, "cpu-avx512", 1, to="error")
    _perf(tmp_path / "pa.json", "h200", gpu="NVIDIA H200")
    _perf(tmp_path / "pb.json", "h100-80gb-hbm3", slowdown=1.5, gpu="NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("KERNEL_LAB_BASELINES", str(tmp_path / "baselines"))
    _noise(tmp_path / "baselines", "h200", 1.02)
    _noise(tmp_path / "baselines", "h100-80gb-hbm3", 1.03)

    w = build.write([str(a), str(b)], str(tmp_path / "out"), [str(tmp_path / "pa.json"), str(tmp_path / "pb.json")])
    summary = w.summary.read_text()
    cards = summary[summary.index("# Across cards: NVIDIA H200 9.0 (a) and NVIDIA H100 80GB HBM3 9.0 (b)"):]
    a_only = cards[cards.index("## Pass on NVIDIA H200 9.0 and not on NVIDIA H100 80GB HBM3 9.0 (2)"):
                   cards.index("## Pass on NVIDIA H100")]
    assert all(cid.replace("|", "\\|") in a_only for cid in failed_on_b) and "pass → fail" in a_only
    b_only = cards[cards.index("## Pass on NVIDIA H100 80GB HBM3 9.0 and not on NVIDIA H200 9.0 (1)"):]
    assert passes_on_b_only[0].replace("|", "\\|") in b_only and "error → pass" in b_only
    assert "| triton-grouped |" in cards and "| **2** | 0 |" in cards
    # the decode kernel is 1.5x slower on b: its fraction of each ceiling fell to 1/1.5, beyond 1.02 * 1.03
    bench = cards[cards.index("## Bench rows"):]
    row = next(line for line in bench.splitlines() if "cpu-avx512" in line and "cpu-rmw-stream" in line)
    assert "**0.667**" in row and "beyond noise" in row
    # rows without A/A noise on either card are listed as unknown, not called beyond or within noise
    assert "noise unknown" in bench and "is unknown" in bench
    page = w.index.read_text()
    assert 'id="cards"' in page and "Every (cell, backend) on both cards" in page
    # the perf JSON given in the other order is matched to its card by its GPU name
    swapped = build.write([str(a), str(b)], str(tmp_path / "out2"), [str(tmp_path / "pb.json"), str(tmp_path / "pa.json")])
    assert "## Bench rows" + swapped.summary.read_text().split("## Bench rows")[1] == bench


def test_same_card_adds_no_cross_card_section(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic.make_run(a, 200, seed=1)
    synthetic.make_run(b, 200, seed=2)
    w = build.write([str(a), str(b)], str(tmp_path / "out"))
    assert "Across cards" not in w.summary.read_text()


def test_noise_unknown_without_noise_json(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LAB_BASELINES", str(tmp_path / "none"))
    _perf(tmp_path / "pa.json", "h200")
    _perf(tmp_path / "pb.json", "h100-80gb-hbm3", slowdown=1.5)
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic.make_run(a, 100)
    synthetic.make_run(b, 100)
    _card(b, "NVIDIA H100 80GB HBM3")
    w = build.write([str(a), str(b)], str(tmp_path / "out"), [str(tmp_path / "pa.json"), str(tmp_path / "pb.json")])
    bench = w.summary.read_text().split("## Bench rows")[1]
    rows = [line for line in bench.splitlines() if line.startswith("| gdn/")]
    assert "A/A noise: a unknown (no " in bench and rows
    assert all(line.endswith("| noise unknown |") for line in rows)   # nothing called beyond or within noise
    assert rows[0].split(" | ")[7] == "0.667"   # the largest move first


def test_h200_records_against_a_changed_copy_as_baseline(tmp_path):
    """The committed H200 full-tier records as the baseline card; a copy on another card where two
    triton-sm90 cells fail and one bench row's kernel is half as fast."""
    base, run = tmp_path / "h200", tmp_path / "other"
    for d in (base, run):
        d.mkdir()
        shutil.copy(H200 / "gpu_full_cells.jsonl", d / "cells.jsonl")
        shutil.copy(H200 / "gpu_full_run.json", d / "run.json")
    shutil.copy(ROOT / "baselines" / "h200" / "perf.json", base / "perf.json")
    _card(run, "NVIDIA H100 80GB HBM3")
    failed = _flip(run, "triton-sm90", 2)
    perf = json.loads((base / "perf.json").read_text())
    slowed = next(b for b in perf["benchmarks"] if b["extra_info"]["impl"] == "triton-sm90")
    for b in perf["benchmarks"]:
        b["extra_info"]["fingerprint"]["key"] = "h100-80gb-hbm3"
    slowed["extra_info"]["fraction_of"] = {k: v / 2 for k, v in slowed["extra_info"]["fraction_of"].items()}
    (tmp_path / "perf.json").write_text(json.dumps(perf))

    w = build.write([str(run)], str(tmp_path / "out"), [str(tmp_path / "perf.json")], baseline=str(base))
    summary = w.summary.read_text()
    cards = summary[summary.index("# Across cards: NVIDIA H200 9.0 (a) and NVIDIA H100 80GB HBM3 9.0 (b)"):]
    assert "## Pass on NVIDIA H200 9.0 and not on NVIDIA H100 80GB HBM3 9.0 (2)" in cards
    assert all(cid in cards for cid in failed)
    bench_lines = cards.split("## Bench rows")[1].splitlines()
    first = next(line for line in bench_lines if line.startswith("| turboquant"))
    assert "triton-sm90" in first and "| 0.5 |" in first   # the largest move comes first


def test_hardware_names_the_gpus_else_the_cpu():
    assert diff.hardware({"gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}] * 2,
                          "cpu": {"model": "x"}}) == "NVIDIA H200 9.0"
    assert diff.hardware({"gpus": [], "cpu": {"model": "AMD EPYC"}}) == "AMD EPYC"
    assert diff.hardware({}) == ""
