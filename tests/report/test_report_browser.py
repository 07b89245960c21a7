"""The HTML report in headless Chromium: a real smoke run's report loads without console errors or
network requests, draws one mark per record, filters by status, shows a repro command that selects
exactly the clicked cell, and is not blank; a partial run's report renders and says what is missing."""
from __future__ import annotations

import json
import re
import shutil

from PIL import Image

from conformance.run import selection
from tests.report.conftest import ARTIFACTS, kernel_lab, shown_records

DRAWN = """() => [[...document.querySelectorAll('#families .m')].map(e => +e.dataset.i),
  [...document.querySelectorAll('#families .niline')].reduce((a, e) => a + +e.dataset.n, 0)]"""
VISIBLE_MARKS = """sel => [...document.querySelectorAll(sel)]
  .filter(e => getComputedStyle(e).visibility === 'visible' && e.offsetParent !== null).length"""


def _report(run_dir, out):
    done = kernel_lab("report", str(run_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"report: {(out / 'index.html').resolve()}" in done.stdout
    return out / "index.html"


def test_smoke_report_in_chromium(smoke_run, open_page, tmp_path):
    page, errors = open_page(_report(smoke_run, tmp_path / "report"))
    expected = shown_records(smoke_run)
    assert errors == []
    # one mark per record of the available backends, except backends implementing none of an op
    # (one line under the op); triton's skips are one line in the table of unavailable backends
    marks, collapsed = page.evaluate(DRAWN)
    assert len(marks) == len(set(marks)) and len(marks) + collapsed == len(expected)
    ops = {n: b["ops"] for n, b in json.loads((smoke_run / "run.json").read_text())["backends"].items()}
    assert collapsed == sum(r["op"] not in ops[r["backend"]].get(r["family"], ()) for r in expected) > 0
    assert "triton" in page.inner_text("#unavailable")
    assert "tier smoke" in page.inner_text("#runs summary")
    page.click("#runs details.run summary")  # a run's card opens on a click (one with problems is open)
    assert "tier\tsmoke" in page.inner_text("#runs")
    models = json.loads((smoke_run / "run.json").read_text())["rounding_models"]
    row = next(line for line in page.inner_text("#runs").splitlines() if line.startswith("rounding models"))
    assert row == "rounding models\t" + "; ".join(
        f"{b}: " + ", ".join(f"{f} {m}" for f, m in fams.items()) for b, fams in models.items())

    # filtering by a status hides the others
    for status in ("pass", "skip"):
        n = sum(r["status"] == status for r in expected)
        assert n > 0
    page.uncheck('#f-status input[data-status="skip"]')
    assert page.evaluate(VISIBLE_MARKS, "#families .m.st-skip") == 0
    assert page.evaluate(VISIBLE_MARKS, "#families .m.st-pass") == sum(r["status"] == "pass" for r in expected)
    page.check('#f-status input[data-status="skip"]')
    assert page.evaluate(VISIBLE_MARKS, "#families .m") == len(marks)

    # a click shows the record and its repro command, which selects exactly that cell (one whose
    # id holds a regex character, '+' of lens=1+2+3, so an unescaped filter would miss it)
    i = next(i for i, r in enumerate(expected) if r["status"] == "pass" and "+" in r["id"])
    mark = page.locator(f'#families .m[data-i="{i}"]')
    rec = expected[i]
    mark.click()
    cmd = page.inner_text("#repro-cmd")
    assert cmd.startswith("kernel-lab conform --tier smoke --filter '") and cmd.endswith(f"--backend {rec['backend']}")
    pattern = re.search(r"--filter '([^']*)'", cmd).group(1)
    assert [c.id for c in selection.select_cells("smoke", pattern=pattern)] == [rec["id"]]
    assert rec["id"] in page.inner_text("#details")
    assert "rounding model" in page.inner_text("#details") and rec["rounding_model"] in page.inner_text("#details")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-smoke.png"
    page.screenshot(path=str(shot), full_page=True)
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert img.size[1] > 800 and len(colours) > 50, "screenshot looks blank"
    assert max(colours)[0] < 0.9 * img.size[0] * img.size[1], "screenshot is mostly one colour"


def test_partial_run_renders(smoke_run, open_page, tmp_path):
    """A run killed midway: no run.json, cells.jsonl cut inside its last line."""
    part = tmp_path / "killed"
    part.mkdir()
    lines = (smoke_run / "cells.jsonl").read_text().splitlines(keepends=True)
    keep = lines[: len(lines) // 2]
    (part / "cells.jsonl").write_text("".join(keep) + lines[len(keep)][:40])
    page, errors = open_page(_report(part, tmp_path / "report"))
    assert errors == []
    text = page.inner_text("#runs")
    assert "Incomplete run" in text and "no run.json" in text and "cut short" in text
    assert "unknown" in text  # command, commit, CPU
    unavailable = {line.split('"backend": "')[1].split('"')[0] for line in keep if "backend unavailable" in line}
    drawn = sum(not any(f'"backend": "{b}"' in line for b in unavailable) for line in keep)
    marks, collapsed = page.evaluate(DRAWN)
    assert len(marks) + collapsed == drawn


def test_empty_run_renders(open_page, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    page, errors = open_page(_report(empty, tmp_path / "report"))
    assert errors == []
    assert "no cells.jsonl" in page.inner_text("#runs")
    assert "No record to draw" in page.inner_text("#matrix")
    assert page.locator("#families .m").count() == 0


def test_copy_of_smoke_run_with_baseline(smoke_run, open_page, tmp_path):
    """--baseline against a copy where one pass was turned into a fail: one fixed cell."""
    base = tmp_path / "base"
    shutil.copytree(smoke_run, base)
    lines = (base / "cells.jsonl").read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if '"status": "pass"' in line)
    lines[i] = lines[i].replace('"status": "pass"', '"status": "fail"').replace('"passed": true', '"passed": false')
    (base / "cells.jsonl").write_text("".join(lines))
    out = tmp_path / "report"
    done = kernel_lab("report", str(smoke_run), "--baseline", str(base), "--out", str(out))
    assert done.returncode == 0, done.stderr
    page, errors = open_page(out / "index.html")
    assert errors == []
    assert "Fixed (failed before, pass now): 1" in page.inner_text("#diff")
    assert "New failures: 0" in page.inner_text("#diff")


def test_failures_lead_the_page_with_counts_machines_and_repro(smoke_run, open_page, tmp_path):
    """Two runs from two machines (a copy of the smoke run whose run.json names another CPU), with
    two planted failures, one whose id holds a quote and a space: the page opens with the coverage
    per code path, the failures table and the counts per backend, each row naming its machine, and
    every repro command is the one conformance.run.repro quotes for a POSIX shell (the panel's too),
    selecting exactly that cell."""
    import shlex

    from conformance.run import repro

    other = tmp_path / "other"
    shutil.copytree(smoke_run, other)
    info = json.loads((other / "run.json").read_text())
    info["cpu"] = {**info["cpu"], "model": "Other CPU 9000"}
    info["gpus"] = [{"name": "NVIDIA H200"}]
    (other / "run.json").write_text(json.dumps(info))
    recs = [json.loads(x) for x in (other / "cells.jsonl").read_text().splitlines()]
    i = next(i for i, r in enumerate(recs) if r["status"] == "pass" and r["backend"] == "numpy-ref")
    recs[i] = {**recs[i], "status": "fail", "reason": "planted", "metrics": {**recs[i]["metrics"], "margin": 3.0},
               "decided_by": {"output": "o", "criterion": "rel_l2"},
               "outputs": {name: {**m, "passed": False} for name, m in recs[i]["outputs"].items()}}
    odd = {**recs[i], "id": recs[i]["id"].replace("/seed=", "/note=it's odd/seed="),
           "params": {**recs[i]["params"], "note": "it's odd"}, "metrics": {"margin": 2.0}}
    (other / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs + [odd]))
    out = tmp_path / "report"
    assert kernel_lab("report", str(smoke_run), str(other), "--out", str(out)).returncode == 0
    page, errors = open_page(out / "index.html")
    assert errors == []
    # failures first, whatever the size of the coverage table, then what ran (and was left out)
    first = page.evaluate("() => [...document.querySelectorAll('main > section')].map(s => s.id).slice(0, 5)")
    assert first == ["failures", "ran", "known", "coverage", "counts"]
    rows = page.locator("#failures table.failures tr").all_inner_texts()[1:]
    assert len(rows) == 2 and "Other CPU 9000, 1x NVIDIA H200" in rows[0] and "o: rel_l2" in rows[0]
    cmds = page.locator("#failures code.rcmd").all_inner_texts()
    assert cmds == [repro.command(recs[i]["id"], "numpy-ref", "smoke"), repro.command(odd["id"], "numpy-ref", "smoke")]
    argv = shlex.split(cmds[1])
    assert argv[argv.index("--filter") + 1] == repro.cell_pattern(odd["id"])
    assert re.fullmatch(argv[argv.index("--filter") + 1], odd["id"]) and "--out" not in argv
    pattern = shlex.split(cmds[0])[shlex.split(cmds[0]).index("--filter") + 1]
    assert [c.id for c in selection.select_cells("smoke", pattern=pattern)] == [recs[i]["id"]]
    counts = page.inner_text("#counts")
    assert "Other CPU 9000, 1x NVIDIA H200" in counts and "machine" in counts
    # the heatmap rows of the two runs name their machines; the panel's repro is the same string
    assert page.locator("#families .rlabel", has_text="numpy-ref [Other CPU 9000, 1x NVIDIA H200]").count() > 0
    rec_i = page.evaluate("""id => { const D = JSON.parse(document.getElementById('report-data').textContent);
        const c = D.cells.findIndex(c => c[0] === id); return D.recs.findIndex(r => r[0] === c); }""", odd["id"])
    page.locator(f'#families .m[data-i="{rec_i}"]').click()
    assert page.inner_text("#repro-cmd") == cmds[1]
