"""The turboquant family's check, as the matrix applies it, on the Triton backends: the small
ci-tier cells pass through the interpreter (CI's coverage of the kernels; ``kernel-lab conform
--backend triton-interpret,...`` runs all of them), and deliberately broken variants of the same
kernels (wrong nibble order, wrong query-to-kv head mapping, last token skipped) fail at least one
ci cell, so the tolerances catch those bugs."""
import pytest

from conformance import registry
from conformance.backends import triton_kernels
from conformance.families import turboquant as F
from conformance.run.inprocess import run_one
from conformance.testing import PLANTED, first_failing_cell
from tests.unit.tq_triton_helpers import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter backends run on machines without a GPU")


def _cost(cell) -> int:
    if cell.op == "store":
        return cell["ntok"]
    return cell["Hk"] * cell["G"] * sum(-(-L // 64) for L in cell["lens"])


SMALL = [c for c in F.cells("ci") if _cost(c) <= 48]


def _small_cells(backend):
    """The small ci cells the backend runs, plus its two cheapest decode cells if none is small."""
    b = registry.get(backend)
    supported = [c for c in F.cells("ci") if b.skip_reason(c) is None]
    small = [c for c in supported if _cost(c) <= 48]
    if not any(c.op != "store" for c in small):
        small += sorted((c for c in supported if c.op != "store"), key=_cost)[:2]
    return small


@pytest.mark.parametrize("backend", ["triton-interpret", "triton-grouped-interpret", "triton-lut-interpret",
                                     "triton-unified-interpret"])
def test_small_ci_cells_pass_through_the_interpreter(backend):
    records = [run_one(c, backend) for c in _small_cells(backend)]
    ran = [r for r in records if r["status"] != "skip"]
    assert any(r["op"] != "store" for r in ran), f"no small ci decode cell ran on {backend}"
    bad = [(r["id"], r["status"], r["reason"][:200]) for r in ran if r["status"] != "pass"]
    assert not bad, bad


def _fails_somewhere(bug, op) -> bool:
    planted = PLANTED[bug]
    cells = [c for c in SMALL if c.op == op and planted.applies(c)][:4]
    assert cells, f"no small ci {op} cell for {bug}"
    model = registry.get("triton-interpret").rounding_model("turboquant")
    impl = planted.plant(triton_kernels.TritonImpl("split", "cpu", "exact"))
    return first_failing_cell(impl, "turboquant", model, cells) is not None


@pytest.mark.parametrize("bug,op", [
    ("turboquant.nibbles-swapped", "store"),
    ("turboquant.wrong-kv-head", "decode"),
    ("turboquant.last-token-skipped", "decode"),
])
def test_planted_bugs_fail_a_ci_cell(bug, op):
    assert _fails_somewhere(bug, op), f"planted bug {bug} passed every checked ci cell"
