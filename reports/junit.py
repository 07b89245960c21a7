"""JUnit XML of run records: one <testsuite> per (run, family), one <testcase> per record.

classname ``family.op.backend``, name the cell id. fail -> <failure>, error and crash -> <error>,
skip and xfail -> <skipped> (with the reason), xpass -> <failure> (an expected failure passed).
A record of an op its backend does not implement is left out, as pytest would not generate it.
Times are the records' duration_s. Characters XML 1.0 cannot hold (control characters other than
tab and newline, lone surrogates, U+FFFE/U+FFFF) are written as visible ``\\xNN`` / ``\\uNNNN``.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

from reports.load import Run
from reports.overview import implemented

OUTCOME = {"fail": "failure", "xpass": "failure", "error": "error", "crash": "error",
           "skip": "skipped", "xfail": "skipped"}

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value) -> str:
    """``str(value)`` with every character XML 1.0 cannot hold spelled out as an escape."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], str(value))


def build(runs: list[Run]) -> ET.ElementTree:
    root = ET.Element("testsuites", name="kernel-lab conformance")
    totals: Counter = Counter()
    for run in runs:
        by_family: dict[str, list] = defaultdict(list)
        for r in run.records:
            if implemented(run, r):
                by_family[r["family"]].append(r)
        for family, recs in by_family.items():
            suite = ET.SubElement(root, "testsuite", name=xml_text(f"{run.name}.{family}"))
            counts: Counter = Counter()
            time_sum = 0.0
            for r in recs:
                t = r.get("duration_s") or 0.0
                time_sum += t
                case = ET.SubElement(suite, "testcase", classname=xml_text(f"{family}.{r['op']}.{r['backend']}"),
                                     name=xml_text(r["id"]), time=f"{t:.6f}")
                kind = OUTCOME.get(r["status"])
                if kind:
                    counts[kind] += 1
                    reason = xml_text(r.get("reason") or r["status"])
                    el = ET.SubElement(case, kind, message=reason[:500], type=r["status"])
                    el.text = "\n".join(xml_text(x) for x in (reason, r.get("traceback")) if x)
            attrs = {"tests": len(recs), "failures": counts["failure"], "errors": counts["error"],
                     "skipped": counts["skipped"], "time": f"{time_sum:.6f}"}
            suite.attrib.update({k: str(v) for k, v in attrs.items()})
            totals.update({k: v for k, v in attrs.items() if k != "time"})
    root.attrib.update({k: str(totals[k]) for k in ("tests", "failures", "errors", "skipped")})
    ET.indent(root)
    return ET.ElementTree(root)


def text(runs: list[Run]) -> str:
    """The junit.xml document of ``runs``."""
    return "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(build(runs).getroot(), encoding="unicode") + "\n"
