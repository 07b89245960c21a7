"""The plain-torch chunked GDN: torch-tensor contract and agreement with its rounding model."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conformance import registry  # noqa: E402
from conformance.cells import make_cell  # noqa: E402
from conformance.families import gdn  # noqa: E402
from conformance.run.inprocess import inputs_copy  # noqa: E402
from optimized.torch.gdn_chunked import chunked  # noqa: E402


def test_updates_a_bf16_pool_in_place_and_returns_float32():
    T, H, HV, K = 70, 2, 4, 32
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, K, generator=gen)
    g, beta = -torch.rand(T, HV, generator=gen) * 0.1, torch.rand(T, HV, generator=gen)
    pool = torch.zeros(3, HV, K, K, dtype=torch.bfloat16)
    o = chunked(q, k, v, g, beta, torch.tensor([0, 70], dtype=torch.int32), pool,
                torch.tensor([2], dtype=torch.int32), state_dtype="bfloat16")
    assert o.dtype == torch.float32 and o.shape == (T, HV, K)
    assert pool[2].abs().sum() > 0 and pool[:2].abs().sum() == 0


@pytest.mark.parametrize("cell", [
    make_cell("gdn", "chunked", state="bfloat16", H=2, HV=6, K=32, lens=(70, 5, 131), decay="weak",
              slots="padded", split=None),
    make_cell("gdn", "chunked", state="float16", H=4, HV=4, K=64, lens=(129,), decay="zero",
              slots="shuffled", split=37),
], ids=lambda c: c.id)
def test_torch_eager_passes_its_bf16_gemm_check(cell):
    backend = registry.get("torch-eager")
    assert backend.rounding_model("gdn") == "bf16-gemm"
    inputs = gdn.make_inputs(cell)
    outputs = backend.run(cell, inputs_copy(inputs))
    result = gdn.check(cell, "bf16-gemm", inputs, outputs)
    assert result.status == "pass", result.reason
    # and it is not the exact computation: the exact check is tighter than its bf16 GEMMs
    exact = gdn.check(cell, "exact", inputs, outputs)
    assert exact.status == "fail"
