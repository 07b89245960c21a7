"""Fixtures of the report tests: a small real run (smoke tier through the CLI) and a headless
Chromium (Debian's package, driven by Playwright; never a downloaded browser)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# numpy-ref and cpu-scalar run; triton is unavailable without a GPU (its records are skips).
SMOKE_BACKENDS = "numpy-ref,cpu-scalar,triton"
ARTIFACTS = Path(__file__).resolve().parents[2] / "reports" / "out"


def kernel_lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lab", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """A real run folder: the smoke tier on SMOKE_BACKENDS, written by `kernel-lab conform`."""
    out = tmp_path_factory.mktemp("smoke") / "run"
    done = kernel_lab("conform", "--tier", "smoke", "--backend", SMOKE_BACKENDS, "--out", str(out))
    assert done.returncode in (0, 1), done.stderr
    return out


def shown_records(run_dir: Path) -> list[dict]:
    """The records the heatmap must draw: those of backends available on the run's machine."""
    info = json.loads((run_dir / "run.json").read_text())
    gone = {n for n, b in info["backends"].items() if not b["available"]}
    lines = (run_dir / "cells.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["backend"] not in gone]


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    """A Playwright persistent context on /usr/bin/chromium with a fresh user-data-dir."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.skip(f"playwright is not importable ({exc}); `make setup` installs the pinned version")
    if not CHROMIUM.exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (`make chromium` installs it; needs root and apt)")
    binary = str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium"))
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                   executable_path=binary, headless=True, args=FLAGS,
                                                   viewport={"width": 1400, "height": 900})
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def open_page(browser_context):
    """open_page(html_path) -> (page, errors): the page loaded from a file:// URL, and the console
    errors and uncaught exceptions seen while loading it."""
    pages = []

    def _open(path: Path):
        page = browser_context.new_page()
        pages.append(page)
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append(f"fetched {r.url}") if not r.url.startswith(("file:", "data:")) else None)
        page.goto(path.resolve().as_uri())
        page.wait_for_load_state("load")
        return page, errors

    yield _open
    for p in pages:
        p.close()
