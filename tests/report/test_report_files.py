"""The report's files and logic without a browser: junit.xml through a JUnit reader, the tolerant
loader, agreement bounds, the baseline diff, perf JSON and the studies' figures."""
from __future__ import annotations

import json

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from conformance.run.records import RecordsError
from kernel_lab import cli
from reports import agreement, build, diff, load, perf, studies
from tests.report import synthetic
from tests.report.conftest import kernel_lab


def test_junit_one_testcase_per_record(tmp_path):
    every = synthetic.make_run(tmp_path / "run", 400)
    w = build.write([str(tmp_path / "run")], str(tmp_path / "out"))
    xml = JUnitXml.fromfile(str(w.junit))
    cases = [case for suite in xml for case in suite]
    # records of an op their backend does not implement are left out, as pytest would not have them
    ops = json.loads((tmp_path / "run" / "run.json").read_text())["backends"]
    recs = [r for r in every if r["op"] in ops[r["backend"]]["ops"].get(r["family"], ())]
    assert len(recs) < len(every) and len(cases) == len(recs) == xml.tests
    by_key = {(r["family"] + "." + r["op"] + "." + r["backend"], r["id"]): r["status"] for r in recs}
    kinds = {"fail": Failure, "xpass": Failure, "error": Error, "crash": Error, "skip": Skipped, "xfail": Skipped}
    for case in cases:
        status = by_key[(case.classname, case.name)]
        results = case.result
        if status == "pass":
            assert results == []
        else:
            assert len(results) == 1 and isinstance(results[0], kinds[status]) and results[0].type == status
    assert xml.failures == sum(r["status"] in ("fail", "xpass") for r in recs)
    assert xml.errors == sum(r["status"] in ("error", "crash") for r in recs)


def test_loader_keeps_readable_records_and_says_what_is_missing(tmp_path):
    run = tmp_path / "run"
    recs = synthetic.make_run(run, 30, finished=False)
    lines = (run / "cells.jsonl").read_text().splitlines()
    lines.append(json.dumps(recs[0]))  # recorded twice
    (run / "cells.jsonl").write_text("\n".join(lines) + "\n" + lines[1][:20])  # killed mid-line
    got = load.load(run)
    text = "\n".join(got.problems)
    assert "recorded twice" in text and "cut short" in text and "no finish time" in text
    assert len(got.records) == len(recs)
    assert got.unavailable() == {"flydsl-gfx950": "no ROCm GPU visible to torch"}
    (run / "run.json").unlink()  # without run.json, unavailability comes from the skips' ``unavailable``
    assert load.load(run).unavailable() == {"flydsl-gfx950": "no ROCm GPU visible to torch"}
    old = tmp_path / "old"  # records of schema version 2 say it only in the reason
    old.mkdir()
    (old / "cells.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "unavailable"}) + "\n"
                                             for r in recs))
    assert load.load(old).unavailable() == {"flydsl-gfx950": "no ROCm GPU visible to torch"}
    with pytest.raises(ValueError, match="RUN_DIR"):
        load.load(tmp_path / "absent")
    # corruption (not a kill) is refused, naming the file and line
    lines[3] = "{not json"
    (run / "cells.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordsError, match=r"cells.jsonl:4: not valid JSON"):
        load.load(run)


def test_cli_names_bad_arguments(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "absent")]) == 2
    assert "RUN_DIR" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert cli.main(["report", str(tmp_path / "run"), "--perf", str(tmp_path / "none.json")]) == 2
    assert "--perf" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "run"), "--baseline", str(tmp_path / "absent")]) == 2
    assert "--baseline" in capsys.readouterr().err


def _rec(backend, margins, status="pass", model="bf16"):
    return {"id": "c", "backend": backend, "status": status, "rounding_model": model,
            "outputs": {k: {"margin": m} for k, m in margins.items()}}


def test_agreement_bounds():
    res = agreement.agreement([_rec("a", {"o": 0.2, "s": 0.1}), _rec("b", {"o": 0.3, "s": 0.6})])
    assert res["pairs"][0]["ruled_out"] == 1 and res["listed"] == []
    res = agreement.agreement([_rec("a", {"o": 0.9}), _rec("b", {"o": 0.8})])
    assert res["pairs"][0]["undecided"] == 1
    assert res["listed"][0]["lower"] == pytest.approx(0.1) and res["listed"][0]["upper"] == pytest.approx(1.7)
    # a tolerance that allows mismatching elements lets a passing margin exceed 1
    res = agreement.agreement([_rec("a", {"o": 2.5}), _rec("b", {"o": 0.5})])
    assert res["pairs"][0]["proven"] == 1
    res = agreement.agreement([_rec("a", {"o": 0.1}), _rec("b", {"o": 0.1}, model="exact")])
    assert res["pairs"][0]["other_oracle"] == 1 and res["pairs"][0]["comparable"] == 0
    res = agreement.agreement([_rec("a", {"o": 0.1}), _rec("b", {"o": 0.1}, status="fail")])
    assert res["pairs"] == []


def test_records_diff():
    def r(i, status, margin=0.1):
        return {"id": f"c{i}", "backend": "b", "status": status, "metrics": {"margin": margin}}
    base = [r(0, "pass"), r(1, "fail"), r(2, "pass", 0.01), r(3, "pass", 0.2), r(4, "pass"), r(5, "skip"), r(6, "pass", 0.0)]
    cur = [r(0, "crash"), r(1, "pass"), r(2, "pass", 0.5), r(3, "pass", 0.3), r(7, "pass"), r(5, "pass"), r(6, "pass", 5e-4),
           r(8, "fail")]
    d = diff.records_diff(cur, base)
    ids = {k: [x["id"] for x in v["rows"]] for k, v in d.items()}
    # a failing pair the baseline did not have (a new backend or cell) is a new failure too
    assert ids == {"new_failures": ["c0", "c8"], "fixed": ["c1"], "margin_moved": ["c2"], "status_changed": ["c5"],
                   "new": ["c7", "c8"], "vanished": ["c4"]}
    assert d["margin_moved"]["rows"][0]["ratio"] == pytest.approx(50)


def test_perf_json_and_perf_diff(tmp_path):
    synthetic.make_perf(tmp_path / "perf.json")
    synthetic.make_perf(tmp_path / "old.json", slowdown=0.8)
    p = perf.load(tmp_path / "perf.json")
    assert len(p.benchmarks) == 4 and [o["name"] for o in p.other] == ["test_old_style_benchmark"]
    assert [g["verdict"] for g in p.gates] == ["pass", "ambiguous"]
    ceilings, notes = p.ceilings()
    assert set(ceilings) == {"cpu-rmw-stream", "amx-bf16"}
    # the roofline draws the highest value of a ceiling; one note per ceiling measured with several
    values = {}
    for b in p.benchmarks:
        for name, c in (b.get("ceilings") or {}).items():
            values.setdefault(name, set()).update(c.values())
    assert {n: max(c.values()) for n, c in ceilings.items()} == {n: max(v) for n, v in values.items()}
    assert sorted(n.split()[0] for n in notes) == sorted(n for n, v in values.items() if len(v) > 1)
    moved = diff.perf_diff(p.benchmarks, perf.load(tmp_path / "old.json").benchmarks)
    assert [(m["bench"], m["impl"], m["verdict"]) for m in moved] == [("gdn/decode", "cpu-avx512", "slower")]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="--perf"):
        perf.load(tmp_path / "bad.json")


def test_perf_section_in_html(tmp_path):
    synthetic.make_run(tmp_path / "run", 50)
    synthetic.make_perf(tmp_path / "perf.json")
    w = build.write([str(tmp_path / "run")], str(tmp_path / "out"), [str(tmp_path / "perf.json")])
    html = w.index.read_text()
    perf_part = html[html.index('<section id="perf">'):html.index('<section id="diff">')]
    assert perf_part.count("<svg") == 1 and "arithmetic intensity" in perf_part  # the roofline
    assert "gdn/decode peer-vllm" in perf_part and "1.3x" in perf_part  # peer's time over ours
    assert "spread straddles the threshold" in perf_part and "[0.95, 1.04]" in perf_part
    assert "test_old_style_benchmark" in perf_part
    empty = build.write([str(tmp_path / "run")], str(tmp_path / "out2")).index.read_text()
    assert "No performance data" in empty


def test_tq_distortion_study_beside_the_paper(tmp_path):
    out = tmp_path / "study-tq-distortion.json"
    done = kernel_lab("study", "tq-distortion", "--vectors", "500", "--out", str(out))
    assert done.returncode == 0, done.stderr
    items, problems = studies.render(studies.find([tmp_path / "run"], None))
    assert problems == [] and [i["name"] for i in items] == ["tq-distortion"]
    svg = items[0]["svg"]
    assert svg.startswith("<svg") and "paper (TurboQuant)" in svg and "measured D_mse" in svg
    (tmp_path / "study-x.json").write_text(json.dumps({"study": "other"}))
    _, problems = studies.render([tmp_path / "study-x.json"])
    assert "not a known study" in problems[0]


def test_summary_tables_each_backend_by_activation_dtype_and_says_why_one_never_ran():
    from reports.markdown import _activation_section

    def rec(backend, act, status, reason=""):
        params = {} if act is None else {"act": act}
        return {"backend": backend, "family": "gdn", "op": "decode", "params": params, "status": status,
                "reason": reason}

    recs = [rec("k", None, "pass"), rec("k", "float16", "pass"), rec("k", "float16", "fail"),
            rec("k", "float32", "skip", "no fp32 here"), rec("old", "bfloat16", "skip", "unavailable")]
    text = "\n".join(_activation_section(recs, {"k": {"gdn": ["decode"]}}))
    assert "| k | 1/1 | 2/2 | 0/1 |" in text and "| old | 0/1 |  |  |" in text
    assert "- **k**, float32: no fp32 here" in text
    assert _activation_section([rec("k", None, "pass")], {}) == []


def test_records_before_margins_covered_every_criterion_are_upgraded(tmp_path):
    """An FLA record as the H200 wrote it: failed on state's rel_l2 with an elementwise margin of
    0.087; a pass at 0.89 of its rel_l2 bound with margin 0.237. The report reads them with the
    margin over every criterion, so colours, the baseline diff and summary.md follow."""
    tol = {"atol": 0.0, "rtol": 0.01, "max_mismatch": 0.0, "rel_l2": 0.00197456, "source": "s"}
    fail = {"id": "gdn/chunked/x=1/seed=0", "backend": "fla", "status": "fail",
            "reason": "state: rel_l2 0.00222 above 0.00197456", "tolerance": tol,
            "metrics": {"margin": 0.0871, "rel_l2": 0.00222, "mismatch": 0.0},
            "outputs": {"o": {"margin": 0.05, "passed": True}, "state": {"margin": 0.0871, "passed": False}}}
    close = {"id": "gdn/chunked/x=2/seed=0", "backend": "fla", "status": "pass", "tolerance": tol,
             "metrics": {"margin": 0.237, "rel_l2": 0.89 * 0.00197456, "mismatch": 0.0},
             "outputs": {"o": {"margin": 0.237, "passed": True}}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (fail, close)))
    got = {r["id"]: r for r in load.load(run).records}
    f, c = got[fail["id"]], got[close["id"]]
    assert f["metrics"]["margin"] == pytest.approx(0.00222 / 0.00197456) and f["metrics"]["margin"] > 1
    assert f["decided_by"] == {"output": "state", "criterion": "rel_l2"}
    assert c["metrics"]["margin"] == pytest.approx(0.89) and c["decided_by"] == {"output": "o", "criterion": "rel_l2"}
    from reports import matrix
    packed = matrix.pack([load.load(run)])
    assert sorted(r[3] for r in packed["recs"]) == [pytest.approx(0.89), pytest.approx(1.124, rel=1e-3)]
    assert "state: rel_l2" in packed["strings"]
    # the baseline diff sees a pass moving from 0.3 to 0.89 of its rel_l2 bound
    before = {**close, "metrics": {**close["metrics"], "rel_l2": 0.3 * 0.00197456}}
    base = tmp_path / "base"
    base.mkdir()
    (base / "cells.jsonl").write_text(json.dumps(before) + "\n")
    moved = diff.records_diff([c], load.load(base).records)["margin_moved"]
    assert moved["count"] == 1 and moved["rows"][0]["ratio"] == pytest.approx(0.89 / 0.3)


def _bench(impl, role, median, shape="L=8192"):
    return {"bench": "turboquant/decode", "impl": impl, "role": role, "name": f"turboquant/decode/{shape}/{impl}",
            "shape": {"L": int(shape.split("=")[1])}, "time_s": {"min": median, "median": median, "max": median, "n": 5}}


def test_perf_table_has_a_column_per_kernel_of_ours():
    """sdpa beside two kernels of ours: 1.48x over the fast one, 0.89x over the portable one, each
    in its own column (a single "time / ours" would show one of them silently)."""
    from reports import html

    rows = [_bench("triton-sm90", "ours", 1.0), _bench("triton-grouped", "ours", 1.66),
            _bench("torch-sdpa", "baseline", 1.48), _bench("gpu-copy", "ceiling", 0.5)]
    (t,) = html.bench_tables(rows)
    assert t["ours"] == ["triton-grouped", "triton-sm90"]
    vs = {r["impl"]: r["vs"] for r in t["rows"]}
    assert vs["torch-sdpa"] == {"triton-sm90": pytest.approx(1.48), "triton-grouped": pytest.approx(1.48 / 1.66)}
    assert vs["triton-grouped"] == {"triton-sm90": pytest.approx(1.66)} and vs["gpu-copy"] == {}
    assert {r["shape_label"] for r in t["rows"]} == {"L=8192"}


def test_gate_reading_says_unmet_target_noisy_and_where_the_rate_was_measured():
    from reports import html

    def g(rate, verdict="fail", where="amd-epyc-2cpu"):
        return html.gate_reading({"gate": "x", "verdict": verdict, "false_alarm_rate": rate, "measured_on": where},
                                 {"intel-xeon-16cpu"})
    unmet = g("40/40")
    assert unmet["reading"] == "unmet target" and unmet["shown_verdict"] == "unmet target"
    assert unmet["elsewhere"] == "amd-epyc-2cpu"
    assert g("2/40")["reading"] == "noisy" and g("2/40")["shown_verdict"] == "fail"
    assert g("0/40", "pass", "intel-xeon-16cpu")["elsewhere"] is None and g("0/40")["reading"] == "quiet"
    assert g("not measured")["reading"] == "not measured" and g("not measured")["elsewhere"] is None
    # a gates file written before descriptions were recorded gets them from the gates TOML
    (loaded,) = perf._described([{"gate": "gdn-decode-bf16-vs-rmw", "verdict": "fail"}])
    assert loaded["description"].startswith("CPU decode") and loaded["measured_on"] == "amd-epyc-2cpu"


def test_roofline_labels_do_not_overprint():
    """Ten points at one place (four shapes of two kernels, as the H200's tq decode rows): every
    label is at least its font size away from every other."""
    import re

    from reports import figures

    pts = [{**_bench(f"impl{i % 3}", "ours", 1.0, f"L={1024 * (i + 1)}"), "flops": 1e9, "bytes": 1e8, "tflops": 5.0}
           for i in range(10)]
    svg = figures.roofline(pts, {"gpu-copy": {"gbps": 4000.0}, "gpu-matmul": {"tflops": 600.0}}, "t")
    labels = re.findall(r'font-size: ([\d.]+)px[^>]*x="([\d.]+)" y="([\d.]+)"[^>]*>turboquant/decode ([^<]+)<', svg)
    assert len(labels) == 10 and all(f"L={1024 * (i + 1)}" in svg for i in range(10))
    ys = sorted(float(y) for _, _, y, _ in labels)
    assert min(b - a for a, b in zip(ys, ys[1:])) >= float(labels[0][0])
    assert "gpu-copy 4,000 GB/s" in svg and "gpu-matmul 600 TFLOP/s" in svg  # ceilings named in the legend


def test_drift_figure_labels_every_measured_length_and_ticks_inside_decades():
    import re

    from reports import figures

    sweep = [{"state_dtype": d, "tokens": t, "o_rel_l2": e * t / 1000, "state_rel_l2": e * t / 500}
             for d, e in (("bfloat16", 1e-3), ("float16", 1.3e-4)) for t in (256, 1024, 4096, 8192)]
    svg = figures.gdn_drift({"length_sweep": sweep, "round_trips": []}, "d")
    assert all(f">{t}</text>" in svg for t in (256, 1024, 4096, 8192))
    y_labels = set(re.findall(r">(\d)e-(\d)</text>", svg))
    assert {("1", "4"), ("2", "4"), ("5", "4"), ("1", "3"), ("2", "3")} <= y_labels, y_labels  # 1, 2, 5 of each decade


def test_fail_on_new_and_the_diff_in_summary_md(tmp_path):
    synthetic.make_run(tmp_path / "base", 60)
    lines = (tmp_path / "base" / "cells.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    i = next(i for i, r in enumerate(recs) if r["status"] == "pass")
    (tmp_path / "now").mkdir()
    now = [dict(r) for r in recs]
    now[i] = {**now[i], "status": "fail", "reason": "planted new failure",
              "outputs": {name: {**m, "passed": False} for name, m in now[i]["outputs"].items()}}
    (tmp_path / "now" / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in now))
    done = kernel_lab("report", str(tmp_path / "now"), "--baseline", str(tmp_path / "base"), "--fail-on-new",
                      "--out", str(tmp_path / "out"))
    assert done.returncode == 1 and "1 new failure(s)" in done.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "# Changes against the baseline" in summary and "| New failures | 1 |" in summary
    assert f"`{recs[i]['id']}`" in summary.split("## New failures (1)")[1] and "planted new failure" in summary
    same = kernel_lab("report", str(tmp_path / "base"), "--baseline", str(tmp_path / "base"), "--fail-on-new",
                      "--out", str(tmp_path / "out2"))
    assert same.returncode == 0
    alone = kernel_lab("report", str(tmp_path / "now"), "--fail-on-new", "--out", str(tmp_path / "out3"))
    assert alone.returncode == 2 and "--fail-on-new: needs --baseline" in alone.stderr
