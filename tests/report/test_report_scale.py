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
