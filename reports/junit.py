"""JUnit XML of run records: one <testsuite> per (run, family), one <testcase> per record.

classname ``family.op.backend``, name the cell id. fail -> <failure>, error and crash -> <error>,
skip and xfail -> <skipped> (with the reason), xpass -> <failure> (an expected failure passed).
Times are the records' duration_s.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

from reports.load import Run

OUTCOME = {"fail": "failure", "xpass": "failure", "error": "error", "crash": "error",
           "skip": "skipped", "xfail": "skipped"}


def build(runs: list[Run]) -> ET.ElementTree:
    root = ET.Element("testsuites", name="kernel-lab conformance")
    totals: Counter = Counter()
    for run in runs:
        by_family: dict[str, list] = defaultdict(list)
        for r in run.records:
            by_family[r["family"]].append(r)
        for family, recs in by_family.items():
            suite = ET.SubElement(root, "testsuite", name=f"{run.name}.{family}")
            counts: Counter = Counter()
            time_sum = 0.0
            for r in recs:
                t = r.get("duration_s") or 0.0
                time_sum += t
                case = ET.SubElement(suite, "testcase", classname=f"{family}.{r['op']}.{r['backend']}",
                                     name=r["id"], time=f"{t:.6f}")
                kind = OUTCOME.get(r["status"])
                if kind:
                    counts[kind] += 1
                    reason = r.get("reason") or r["status"]
                    el = ET.SubElement(case, kind, message=reason[:500], type=r["status"])
                    el.text = "\n".join(x for x in (reason, r.get("traceback")) if x)
            attrs = {"tests": len(recs), "failures": counts["failure"], "errors": counts["error"],
                     "skipped": counts["skipped"], "time": f"{time_sum:.6f}"}
            suite.attrib.update({k: str(v) for k, v in attrs.items()})
            totals.update({k: v for k, v in attrs.items() if k != "time"})
    root.attrib.update({k: str(totals[k]) for k in ("tests", "failures", "errors", "skipped")})
    ET.indent(root)
    return ET.ElementTree(root)


def write(runs: list[Run], path) -> None:
    build(runs).write(path, encoding="utf-8", xml_declaration=True)
