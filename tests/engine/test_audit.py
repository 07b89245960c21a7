"""The tolerance audit (conformance.audit, `kernel-lab audit-tolerances`): per term of a family, the
worst margin of the records whose deciding tolerance names it; the committed audits cover every term."""
import json

import pytest

from conformance import audit, families
from conformance.run import records
from kernel_lab import cli


def _run(folder, tier, recs, commit="abc1234"):
    folder.mkdir()
    records.dump_json(folder / "run.json", {"selection": {"tier": tier}, "git": {"commit": commit, "dirty": False},
                                            "finished": "2026-12-01T21:00:00+0000"})
    records.write_all(folder / "cells.jsonl", recs)
    return folder


def _rec(cell, backend, status, margin, terms):
    return {"id": cell, "family": "gdn", "op": "decode", "backend": backend, "status": status,
            "metrics": {"margin": margin}, "tolerance": {"source": "; ".join(terms), "terms": terms}}


def test_worst_margin_per_term_with_cell_backend_commit_and_date(tmp_path):
    run = _run(tmp_path / "run", "ci", [
        _rec("a", "x", "pass", 0.2, ["gdn.fp32", "gdn.state-16bit"]),
        _rec("b", "y", "pass", 0.7, ["gdn.fp32"]),
        _rec("c", "y", "skip", 9.0, ["gdn.fp32"]),                     # a skip measured nothing
        _rec("d", "y", "pass", 0.9, ["gdn.fp32x"]),                    # a longer name is another term
        {**_rec("e", "y", "pass", 0.95, []), "tolerance": {"source": "gdn.fp32 (L=1)"}}])   # terms not recorded
    result = audit.audit("gdn", *audit.read_runs([str(run)]))
    assert result["tier"] == "ci" and result["commit"] == "abc1234" and result["date"] == "2026-12-01"
    assert result["terms"]["gdn.fp32"] == {"records": 2, "worst_margin": 0.7, "worst_cell": "b", "worst_backend": "y"}
    assert result["terms"]["gdn.state-16bit"]["worst_margin"] == 0.2
    assert result["terms"]["gdn.bf16-gemm"] == {"records": 0, "worst_margin": None, "worst_cell": None,
                                                "worst_backend": None}
    assert set(result["terms"]) == {s.name for s in families.get("gdn").SPECS}


def test_the_command_writes_one_file_per_family_and_refuses_mixed_tiers(tmp_path, capsys):
    ci = _run(tmp_path / "ci", "ci", [_rec("a", "x", "pass", 0.5, ["gdn.gating"])])
    assert cli.main(["audit-tolerances", str(ci), "--family", "gdn", "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "gdn.json").read_text())
    assert written["terms"]["gdn.gating"]["worst_margin"] == 0.5
    assert "gdn.gating" in capsys.readouterr().out
    smoke = _run(tmp_path / "smoke", "smoke", [])
    assert cli.main(["audit-tolerances", str(ci), str(smoke), "--out", str(tmp_path / "out")]) == 2
    assert "different tiers" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["gdn", "turboquant"])
def test_the_committed_audit_covers_every_term_of_the_family_on_the_ci_tier(family):
    committed = audit.load(family)
    assert committed is not None, f"no {audit.FILE_NAME} for {family}: run `kernel-lab audit-tolerances`"
    assert committed["tier"] == "ci" and committed["commit"] and committed["date"]
    assert set(committed["terms"]) == {s.name for s in families.get(family).SPECS}
