"""Slow: a report of 20,000 synthetic records (two runs' worth of backends, perf JSON, a baseline)
stays small enough and renders in Chromium in seconds; prints size and times, keeps a screenshot."""
from __future__ import annotations

import time

import pytest

from reports import build
from tests.report import synthetic
from tests.report.conftest import ARTIFACTS

pytestmark = pytest.mark.slow
N = 20_000


def test_20k_records(tmp_path, open_page):
    recs = synthetic.make_run(tmp_path / "run", N)
    synthetic.make_run(tmp_path / "base", N, seed=1)
    synthetic.make_perf(tmp_path / "run" / "perf.json")
    synthetic.make_perf(tmp_path / "base" / "perf.json", slowdown=0.8)
    t0 = time.perf_counter()
    w = build.write([str(tmp_path / "run")], str(tmp_path / "out"), [str(tmp_path / "run" / "perf.json")],
                    str(tmp_path / "base"))
    build_s = time.perf_counter() - t0
    size_mb = w.index.stat().st_size / 1e6
    t0 = time.perf_counter()
    page, errors = open_page(w.index)
    load_s = time.perf_counter() - t0
    assert errors == []
    nav = page.evaluate("() => { const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd; }")
    draw_ms = float(page.evaluate("document.body.dataset.drawMs"))
    shown = page.locator("#families .m").count()
    assert shown == sum(r["backend"] not in synthetic.UNAVAILABLE for r in recs)
    t0 = time.perf_counter()
    page.select_option("#f-backend", label="triton")
    filter_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    page.locator("#families .m").first.click()
    page.wait_for_selector("#repro-cmd")
    click_s = time.perf_counter() - t0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.select_option("#f-backend", value="")
    page.screenshot(path=str(ARTIFACTS / "report-20k.png"))
    print(f"\n{len(recs)} records ({shown} drawn): index.html {size_mb:.2f} MB, built in {build_s:.1f} s; "
          f"Chromium: goto+load {load_s:.2f} s, load event at {nav:.0f} ms, heatmap drawn in {draw_ms:.0f} ms; "
          f"backend filter {filter_s:.2f} s, click to details {click_s:.2f} s")
    assert size_mb < 10 and nav < 10_000


def test_a_10_mb_name_read_from_a_folder_is_clipped_on_the_page(tmp_path):
    # the writer clips what it writes; a folder from elsewhere holds what it likes
    import json

    from conformance.run import records

    big = "n" * (10 << 20)
    run = tmp_path / "run"
    run.mkdir()
    rec = {"id": f"toy/scale/name={big}/seed=0", "family": "toy", "op": "scale", "params": {"name": big}, "seed": 0,
           "backend": "b" * (10 << 20), "status": "error", "reason": "r" * (10 << 20), "duration_s": 0.1}
    (run / "cells.jsonl").write_text(json.dumps(rec) + "\n")
    (run / "run.json").write_text(json.dumps({"cpu": {"model": "m" * (10 << 20), "flags": []}}))
    w = build.write([str(run)], str(tmp_path / "report"))
    for path in (w.index, w.summary, w.junit):
        assert path.stat().st_size < 1 << 20, (path, path.stat().st_size)
    assert "more characters cut]" in w.index.read_text()
    assert records.MAX_TEXT < 10 << 20
