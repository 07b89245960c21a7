"""GPU-only properties of the Triton GDN chunked prefill: captured in a CUDA graph (the value checks skipped
while capturing), its replay recomputes the prefill for new inputs (the same output and pool as an eager call
from the same pool), and slots no sequence names keep their bytes."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tests.unit.gpu_replay import assert_equal, replay_then_eager  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
    reason="needs a CUDA/ROCm GPU (not the interpreter)")]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chunked_replays_in_a_cuda_graph(state_dtype):
    from optimized.triton.gdn_chunked import chunked

    g = torch.Generator(device="cuda").manual_seed(0)
    lens, H, HV, K, V, S = [200, 1, 64, 130], 2, 4, 128, 128, 7
    T = sum(lens)

    def randn(*shape, dtype=torch.bfloat16, s=1.0):
        return (s * torch.randn(*shape, generator=g, device="cuda")).to(dtype)

    q, k, v = randn(T, H, K), randn(T, H, K), randn(T, HV, V)
    gl = -torch.rand(T, HV, generator=g, device="cuda") * 0.1
    beta = torch.rand(T, HV, generator=g, device="cuda").to(torch.bfloat16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    idx = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device="cuda")
    pool = randn(S, HV, K, V, dtype=state_dtype, s=0.1)
    out = torch.empty(T, HV, V, dtype=torch.bfloat16, device="cuda")

    def step():
        return chunked(q, k, v, gl, beta, cu, pool, idx, out=out)

    start = pool.clone()
    step()  # compile
    torch.cuda.synchronize()
    replayed, replayed_pool = replay_then_eager(step, out, pool, start, lambda: q.copy_(randn(T, H, K)))
    assert torch.isfinite(replayed.float()).all()
    assert_equal(replayed, out)
    assert_equal(replayed_pool, pool)
    assert torch.equal(pool[[1, 2, 4, 6]], start[[1, 2, 4, 6]]), "slots no sequence names changed"
    assert not out[200:201].float().abs().any(), "a padding sequence's rows are zeros"


@pytest.mark.parametrize("state", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("block_v", [32, 128])
def test_the_segmented_state_pass_passes_its_models_check(monkeypatch, state, block_v):
    """``stages(segment_chunks=...)`` at Qwen3-Next's head size (K = V = 128) against the
    ``bf16-operands-segmented`` oracle, sequences of 1 to 6 chunks and a padding slot."""
    import functools

    from conformance.backends.triton_gdn import TritonGdnImpl
    from conformance.cells import make_cell
    from conformance.families import gdn
    from conformance.families.gdn.oracle import SEGMENT_CHUNKS
    from optimized.triton import gdn_chunked as C

    monkeypatch.setattr(C, "stages", functools.partial(C.stages, segment_chunks=SEGMENT_CHUNKS,
                                                       state_block_v=block_v, state_warps=8,
                                                       state_stages=2 if block_v > 32 else 3))
    cell = make_cell("gdn", "chunked", state=state, H=2, HV=4, K=128, lens=(200, 1, 64, 130, 384), decay="weak",
                     slots="padded", qk="unit", split=None, act="bfloat16")
    x = gdn.make_inputs(cell)
    got = gdn.run_with(TritonGdnImpl("cuda", kernel="triton-gdn-chunked"), cell, {**x, "state": x["state"].copy()})
    verdict = gdn.check(cell, "bf16-operands-segmented", x, got)
    assert verdict.status == "pass", verdict.reason
