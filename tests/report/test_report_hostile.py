"""A run folder of hostile strings (tests/report/hostile.py) through `kernel-lab report`: the page
in Chromium runs no injected script and shows every text as text, junit.xml is well-formed XML with
every text kept, summary.md holds no markup taken from the records."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from junitparser import JUnitXml

from reports import markdown
from tests.report import hostile
from tests.report.conftest import kernel_lab


@pytest.fixture
def hostile_report(tmp_path):
    run, recs = hostile.make_run(tmp_path)
    out = tmp_path / "report"
    done = kernel_lab("report", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, recs


def test_hostile_strings_stay_text_in_the_page(hostile_report, open_page):
    out, recs = hostile_report
    page, errors = open_page(out / "index.html")
    assert errors == []
    assert page.evaluate("() => window.__pwned") is None
    assert page.evaluate("() => document.scripts.length") == 2  # the data and the report's script
    assert page.locator("img").count() == 0
    runs = page.inner_text("#runs")
    for field in ("cpu.model", "gpu.name", "command", "git.commit", "version.value", "stopped", "rm.model"):
        assert f"<<{field}>>" in runs, field
    assert "<script>window.__pwned=5</script>" in runs  # the folder's name, as text
    assert "<<unavailable.reason>>" in page.inner_text("#unavailable")
    marks = page.locator("#families .m")
    assert marks.count() == len(recs)
    for i in range(len(recs)):
        page.locator(f'#families .m[data-i="{i}"]').click()
        details = page.inner_text("#details")
        n = int(re.search(r"<<reason#(\d+)>>", details).group(1))
        for field in ("id", "reason", "rounding_model", "tolerance.source", "output.name", "param.value",
                      "quality.key", "traceback", "device", "warning"):
            assert f"<<{field}#{n}>>" in details, (field, details)
        assert "</script><script>window.__pwned=2</script>" in details
    assert page.evaluate("() => window.__pwned") is None


def test_hostile_strings_keep_junit_well_formed(hostile_report):
    out, recs = hostile_report
    root = ET.parse(out / "junit.xml").getroot()  # raises on ill-formed XML
    cases = root.findall(".//testcase")
    assert len(cases) == len(recs) == JUnitXml.fromfile(str(out / "junit.xml")).tests
    for case in cases:
        n = int(re.search(r"<<id#(\d+)>>", case.get("name")).group(1))
        assert case.get("name").startswith("<!--<script>") and "\\x00\\x01\\x08\\x0b\\x1b" in case.get("name")
        assert f"<<backend#{n}>>" in case.get("classname")
        for result in case:
            assert f"<<reason#{n}>>" in result.get("message") and f"<<traceback#{n}>>" in result.text


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells, split at pipes that are not backslash-escaped."""
    return re.split(r"(?<!\\)\|", row.strip())[1:-1]


def test_hostile_strings_carry_no_markup_into_the_summary(hostile_report):
    out, recs = hostile_report
    text = (out / "summary.md").read_text(encoding="utf-8")
    assert "\x00" not in text and "\u2028" not in text and "\x1b" not in text
    # outside code spans (which show their text literally) and our own **bold**: no markup
    outside = re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)|max_abs|rel_l2", "", text).replace("\\\\", "")
    assert "<" not in outside
    assert not re.search(r"(?<!\\)[`*_\[\]]", re.sub(r"(?<!\\)\*\*", "", outside))
    lines = text.splitlines()
    assert not any(line.startswith(("# heading", "- item")) for line in lines)
    assert all(f"<<reason#{n}>>".replace("<", "&lt;").replace(">", "&gt;") in text for n in (1, 4, 5, 6))
    header = None
    for line in lines:
        if line.startswith("|"):
            cells = _cells(line)
            header = header or len(cells)
            assert len(cells) == header, line
        else:
            header = None


@pytest.mark.parametrize("value", ["a`b", "``x``", "`", "p|q", "plain"])
def test_markdown_code_span_holds_any_backticks(value):
    span = markdown.code(value)
    fence = re.match("`+", span).group()
    inner = span[len(fence):-len(fence)]
    assert "`" * len(fence) not in inner and inner.strip(" ").replace("\\|", "|") == value
