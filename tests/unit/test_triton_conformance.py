"""The turboquant family's check, as the matrix applies it, on the Triton backends: the small
ci-tier cells pass through the interpreter (CI's coverage of the kernels; ``kernel-lab conform
--backend triton-interpret,...`` runs all of them), and deliberately broken variants of the same
kernels (wrong nibble order, wrong query-to-kv head mapping, last token skipped) fail at least one
ci cell, so the tolerances catch those bugs."""
import numpy as np
import pytest

from tests.unit.tq_triton_helpers import DEVICE  # noqa: F401,E402  (sets TRITON_INTERPRET)

from conformance import registry  # noqa: E402
from conformance.backends import triton_kernels  # noqa: E402
from conformance.inprocess import inputs_copy, run_one  # noqa: E402
from conformance.families import turboquant as F  # noqa: E402

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


class _Broken(triton_kernels._Impl):
    def __init__(self, bug):
        super().__init__("split", "cpu", "exact")
        self.bug = bug

    def store(self, kv_cache, key, value, slot_mapping, preset, layout, rotation):
        cache = super().store(kv_cache, key, value, slot_mapping, preset, layout, rotation)
        if self.bug == "nibble_order":  # swap the nibbles of every key byte of every written record
            from reference.turboquant import layout as L
            from reference.turboquant.presets import preset as lookup
            p = lookup(preset)
            _, bs, Hk, _ = cache.shape
            D = key.shape[-1]
            slots = slot_mapping[slot_mapping >= 0]
            offs = L.field_offsets(p, D, Hk, bs, layout, slots[:, None], np.arange(Hk))
            idx = L.byte_indices(offs["key_data"], p.key_data_bytes(D))
            flat = cache.reshape(-1)
            flat[idx] = ((flat[idx] & 15) << 4) | (flat[idx] >> 4)
        return cache

    def decode(self, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        if self.bug == "head_mapping":  # kv head hq % Hk instead of hq // G
            Hk = kv_cache.shape[2]
            G = query.shape[1] // Hk
            perm = np.array([(hq % Hk) * G + hq // Hk for hq in range(query.shape[1])])
            out = super().decode(query[:, perm], kv_cache, block_table, seq_lens, preset, layout, rotation,
                                 scale, None if sinks is None else sinks[perm])
            return out[:, np.argsort(perm)]
        if self.bug == "skip_last_token":
            seq_lens = np.maximum(seq_lens - 1, 1).astype(np.int32)
        return super().decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks)


def _fails_somewhere(bug, op, want) -> bool:
    backend = registry.get("triton-interpret")
    cells = [c for c in SMALL if c.op == op and want(c)][:4]
    assert cells, f"no small ci {op} cell for {bug}"
    for cell in cells:
        inputs = F.make_inputs(cell)
        outputs = F.run_with(_Broken(bug), cell, inputs_copy(inputs))
        if F.check(cell, backend.rounding_model("turboquant"), inputs, outputs).status == "fail":
            return True
    return False


def _mse_keys(cell) -> bool:
    return cell["preset"] != "turboquant_k8v4"


@pytest.mark.parametrize("bug,op,want", [
    ("nibble_order", "store", _mse_keys),
    ("head_mapping", "decode", lambda c: c["Hk"] > 1 and c["G"] > 1),
    ("skip_last_token", "decode", lambda c: True),
])
def test_planted_bugs_fail_a_ci_cell(bug, op, want):
    assert _fails_somewhere(bug, op, want), f"planted bug {bug} passed every checked ci cell"
