"""The known differences of the GPU peers (``fla`` chunked, ``vllm-triton-tq-unified`` at D=256) against
the H200 record of 2026-12-01 (reports/baselines/h200/peers_full_cells.jsonl): every recorded failure
is declared (xfail, or skip with its reason), and no recorded pass is declared a failure (an xpass)."""
import json
import pathlib

import pytest

from conformance import registry
from conformance.cells import make_cell

RECORD = pathlib.Path(__file__).parents[2] / "reports/baselines/h200/peers_full_cells.jsonl"


def _records(backend, op=None):
    rows = [json.loads(line) for line in RECORD.read_text().splitlines()]
    out = []
    for r in rows:
        if r["backend"] == backend and r["status"] != "skip" and (op is None or r["op"] == op):
            cell = make_cell(r["family"], r["op"], seed=r["seed"], **r["params"])
            assert cell.id == r["id"]
            out.append((cell, r))
    assert out, f"no {backend} records in {RECORD}"
    return out


def test_fla_chunked_failures_are_declared_and_passes_are_not():
    fla = registry.get("fla")
    declared = {"xfail": 0, "skip": 0}
    for cell, r in _records("fla", "chunked"):
        skip, xfail = fla.supports(cell), fla.xfail(cell)
        if r["status"] == "pass":
            assert xfail is None, f"{cell.id} passed on the H200 but is declared xfail (an xpass)"
        else:
            assert r["status"] == "fail", r
            assert skip or xfail, f"{cell.id} failed on the H200 ({r['reason']}) and is not declared"
        if skip:
            assert "coin flip" in skip and "chunk_o.py#L565" in skip
            declared["skip"] += 1
        elif xfail:
            assert "chunk_o.py#L565" in xfail and "chunk_delta_h.py#L250" in xfail
            declared["xfail"] += 1
    assert declared == {"xfail": 26, "skip": 3}


def test_fla_recurrent_and_fla_naive_declare_nothing():
    for cell, _ in _records("fla", "recurrent"):
        assert registry.get("fla").xfail(cell) is None
        assert registry.get("fla-naive").xfail(cell) is None
    for cell, _ in _records("fla", "chunked"):
        assert registry.get("fla-naive").xfail(cell) is None
        assert "coin flip" not in (registry.get("fla-naive").supports(cell) or "")


def test_vllm_unified_skips_exactly_the_cells_that_ran_out_of_shared_memory():
    unified = registry.get("vllm-triton-tq-unified")
    errors = 0
    for cell, r in _records("vllm-triton-tq-unified"):
        why = unified.supports(cell)
        if r["status"] == "error":
            assert "Required: 278528" in r["reason"] and "Hardware limit: 232448" in r["reason"]
            assert why is not None and "278528 bytes" in why and "_tq_fuse_q_rotation" in why, cell.id
            errors += 1
        else:
            assert why is None, f"{cell.id} ran ({r['status']}) on the H200 but is now skipped: {why}"
    assert errors == 7


@pytest.mark.parametrize("D,G,need", [(256, 8, 278528), (128, 8, 73728), (256, 32, 294912)])
def test_unified_prologue_bytes(D, G, need):
    from conformance.backends.vllm_triton_tq import unified_prologue_bytes

    assert unified_prologue_bytes(D, G) == need
