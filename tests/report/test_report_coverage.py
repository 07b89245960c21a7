"""The coverage table per backend and code path: its counts from a run folder of records of known
paths (one path only skipped, records without a path, an op the backend does not implement), the
same table in summary.md and index.html, and in Chromium on the first screen without scrolling."""
from __future__ import annotations

import json

from reports import build, coverage, load
from tests.report.conftest import ARTIFACTS, kernel_lab

NO_AMX = "backend unavailable: this CPU lacks amx-tile, amx-bf16"
K96 = "the chunk kernel needs K, V multiples of 32 up to 256 (K=96, V=96)"


def _rec(n: int, backend: str, op: str, status: str, path: str | None, reason: str = "") -> dict:
    rec = {"id": f"gdn/{op}/n={n}/seed=0", "family": "gdn", "op": op, "params": {"n": n}, "seed": 0,
           "backend": backend, "status": status, "reason": reason or None, "duration_s": 0.0}
    return rec if path is None else {**rec, "path": path}


RECORDS = [
    *(_rec(n, "cpu-amx", "decode", "skip", "amx", NO_AMX) for n in range(3)),
    _rec(0, "cpu-amx", "gating", "skip", "scalar", NO_AMX),
    _rec(0, "cpu-avx512", "decode", "pass", "avx512"), _rec(1, "cpu-avx512", "decode", "pass", "avx512"),
    _rec(2, "cpu-avx512", "decode", "fail", "avx512", "o beyond tolerance"),
    _rec(3, "cpu-avx512", "chunked", "skip", "avx512", K96), _rec(4, "cpu-avx512", "chunked", "skip", "avx512", K96),
    _rec(5, "cpu-avx512", "chunked", "skip", "avx512", "another reason"),
    _rec(0, "cpu-avx512", "gating", "pass", "scalar"),
    _rec(0, "cpu-avx512", "recurrent", "skip", "avx512", "cpu-avx512 does not implement gdn/recurrent"),
    _rec(0, "triton-gdn-interpret", "decode", "pass", "interpreter"),
    _rec(1, "triton-gdn-interpret", "decode", "xfail", "interpreter", "known"),
    _rec(2, "triton-gdn-interpret", "decode", "error", "interpreter", "ValueError: x"),
    _rec(0, "numpy-ref", "decode", "pass", None), _rec(1, "numpy-ref", "decode", "pass", None),
]
CPU_OPS = {"gdn": ["gating", "chunked", "decode", "spec_decode"]}
ALL_OPS = {"gdn": ["gating", "chunked", "decode", "spec_decode", "recurrent"]}


def _run_folder(path):
    path.mkdir()
    (path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    backends = {"cpu-amx": {"available": False, "reason": NO_AMX[len("backend unavailable: "):], "ops": CPU_OPS},
                "cpu-avx512": {"available": True, "reason": "AVX-512 F/BW/VL/BF16 present", "ops": CPU_OPS},
                "triton-gdn-interpret": {"available": True, "reason": "interpreter", "ops": ALL_OPS},
                "numpy-ref": {"available": True, "reason": "numpy", "ops": ALL_OPS}}
    (path / "run.json").write_text(json.dumps({"schema": 2, "backends": backends, "finished": "2026-12-02T00:00:00"}))
    return path


def test_coverage_counts_each_backend_and_path(tmp_path):
    table = coverage.rows([load.load(_run_folder(tmp_path / "run"))])
    got = [(r["backend"], r["path"], r["ran"], r["passed"], r["failed"], r["xfail"], r["skipped"], r["reasons"],
            r["none_ran"]) for r in table]
    assert got == [
        ("cpu-amx", "amx", 0, 0, 0, 0, 3, [(NO_AMX, 3)], True),
        ("cpu-amx", "scalar", 0, 0, 0, 0, 1, [(NO_AMX, 1)], True),
        ("cpu-avx512", "avx512", 3, 2, 1, 0, 3, [(K96, 2), ("another reason", 1)], False),  # recurrent left out
        ("cpu-avx512", "scalar", 1, 1, 0, 0, 0, [], False),
        ("numpy-ref", coverage.NOT_RECORDED, 2, 2, 0, 0, 0, [], False),
        ("triton-gdn-interpret", "interpreter", 3, 1, 1, 1, 0, [], False)]
    assert coverage.unexercised(table) == ["cpu-amx / amx", "cpu-amx / scalar"]


def test_summary_md_and_index_html_hold_the_coverage_table(tmp_path):
    written = build.write([str(_run_folder(tmp_path / "run"))], str(tmp_path / "out"))
    summary = written.summary.read_text()
    section = summary.split("## Coverage per backend and code path")[1].split("\n## ")[0]
    assert "**no cell ran** on 2 path(s): cpu-amx / amx, cpu-amx / scalar" in section
    assert (f"| cpu-amx | amx | 0 **no cell ran** | 0 | 0 | 3 | 3x {NO_AMX} |" in section)
    assert (f"| cpu-avx512 | avx512 | 3 | 2 | 1 | 3 | 2x {K96}; 1x another reason |" in section)
    assert "| numpy-ref | not recorded | 2 | 2 | 0 | 0 |  |" in section
    assert summary.index("## Coverage per backend") < summary.index("## Per backend")
    html = written.index.read_text()
    assert html.index('<section id="failures">') < html.index('<section id="coverage">')   # failures lead
    assert html.count('<tr class="noran">') == 2


def test_coverage_table_is_on_the_first_screen(smoke_run, open_page, tmp_path):
    """The smoke run's report (numpy-ref, cpu-scalar ran; triton unavailable, its cells skipped) at 1400 x 900: the
    whole coverage table lies inside the first screen, triton's path marked "no cell ran"."""
    out = tmp_path / "report"
    assert kernel_lab("report", str(smoke_run), "--out", str(out)).returncode == 0
    page, errors = open_page(out / "index.html")
    assert errors == []
    assert page.evaluate("() => window.scrollY") == 0
    box = page.locator("#coverage table.coverage").bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"]
    rows = page.locator("#coverage table.coverage tr").all_inner_texts()[1:]
    expected = coverage.rows([load.load(smoke_run)])
    assert [r.split("\t")[:2] for r in rows] == [[r["backend"], r["path"]] for r in expected]
    by_path = {tuple(r.split("\t")[:2]): r for r in rows}
    assert "no cell ran" in by_path["triton", "gpu"] and "backend unavailable" in by_path["triton", "gpu"]
    assert by_path["cpu-scalar", "scalar"].split("\t")[2] == str(
        next(r["ran"] for r in expected if r["backend"] == "cpu-scalar")) != "0"
    assert page.locator("#coverage tr.noran").count() == sum(r["none_ran"] for r in expected) > 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-coverage.png"))
