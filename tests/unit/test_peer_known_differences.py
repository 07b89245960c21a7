"""The known differences of the GPU peers against the H200 record of 2026-12-01
(ledger/h200/peers_full_cells.jsonl). ``fla`` chunked: held to the ``fla-chunk`` model, which
follows FLA's rounding points, so it declares nothing; on the CPU the model's emulation of FLA passes
under it (and fails under ``bf16-operands``, as FLA did on the H200), and FLA's naive reference with a
planted bug fails under it. ``vllm-triton-tq-unified`` at D=256: skips exactly the cells that ran out of
shared memory."""
import json
import pathlib

import pytest

from conformance import registry
from conformance.cells import make_cell

RECORD = pathlib.Path(__file__).parents[2] / "ledger/h200/peers_full_cells.jsonl"


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


def _record(cell_id):
    return next((cell, r) for cell, r in _records("fla", "chunked") if cell.id == cell_id)


# recorded H200 failures under bf16-operands, small enough for the CPU
FAILED = ("gdn/chunked/state=float32/H=16/HV=32/K=64/lens=1/decay=zero/slots=shuffled/split=none/seed=0",
          "gdn/chunked/state=float32/H=4/HV=12/K=64/lens=64/decay=zero/slots=padded/split=none/seed=0",
          "gdn/chunked/state=bfloat16/H=4/HV=12/K=128/lens=1/decay=weak/slots=padded/split=none/seed=0")


def test_fla_declares_nothing_and_its_chunked_op_is_held_to_fla_chunk():
    from conformance.families.gdn.models import oracle_kind

    fla, naive = registry.get("fla"), registry.get("fla-naive")
    assert fla.rounding_models == {"gdn": "fla-chunk"} and naive.rounding_models == {"gdn": "exact"}
    for cell, r in _records("fla"):
        assert fla.xfail(cell) is None and naive.xfail(cell) is None, cell.id
        assert oracle_kind(cell, "fla-chunk") == ("fla-chunk" if cell.op == "chunked" else "exact")
        if r["status"] in ("pass", "fail"):
            assert fla.supports(cell) is None, f"{cell.id} ran on the H200 but is now skipped"


@pytest.mark.parametrize("cell_id", FAILED)
def test_the_emulation_of_fla_passes_under_fla_chunk_and_fails_under_bf16_operands(cell_id):
    from conformance.memo import Memo
    from conformance.testing import reference_impl, verdict_of

    cell, r = _record(cell_id)
    assert r["status"] == "fail"
    emulation, memo = reference_impl("gdn", "fla-chunk"), Memo()
    assert verdict_of(emulation, cell, "fla-chunk", memo).status == "pass"
    assert verdict_of(emulation, cell, "bf16-operands", memo).status == "fail"


@pytest.mark.parametrize("bug,cell_id", [
    ("gdn.head-mapping-tiled", FAILED[0]),
    ("gdn.chunk-update-skipped",
     "gdn/chunked/state=float32/H=4/HV=4/K=64/lens=273/decay=strong/slots=shuffled/split=37/seed=0"),
])
def test_fla_naive_with_a_planted_bug_fails_under_fla_chunk(bug, cell_id):
    pytest.importorskip("fla.ops.gated_delta_rule.naive")
    from conformance.backends.fla_gdn import FlaImpl
    from conformance.testing import PLANTED, verdict_of

    cell, _ = _record(cell_id)
    assert PLANTED[bug].applies(cell)
    found = verdict_of(PLANTED[bug].plant(FlaImpl(gpu=False)), cell, "fla-chunk")
    assert found.status == "fail", found.reason


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
