"""GPU-only properties of the Triton GDN decode and spec decode (each kernel that serves it): with a workspace
and ``out`` given, a call allocates nothing on the device, and it can be captured in a CUDA graph whose replay
recomputes the step for new inputs (the same output and pool as an eager call from the same pool)."""
import os

import pytest

torch = pytest.importorskip("torch")
from tests.unit.gpu_replay import assert_allocates_nothing, assert_equal, replay_then_eager  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
    reason="needs a CUDA/ROCm GPU (not the interpreter)")]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_allocates_nothing_and_replays_in_a_cuda_graph(state_dtype):
    from optimized.triton.gdn_recurrent import Workspace, decode

    g = torch.Generator(device="cuda").manual_seed(0)
    N, H, HV, K, V, S = 6, 4, 8, 128, 128, 9

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    q, k, v, a, b = randn(N, H, K), randn(N, H, K), randn(N, HV, V), randn(N, HV), randn(N, HV)
    A_log, dt_bias = randn(HV, dtype=torch.float32), randn(HV)
    pool = randn(S, HV, K, V, dtype=state_dtype)
    idx = torch.tensor([3, -1, 0, 8, 5, 1], dtype=torch.int32, device="cuda")
    out, ws = torch.empty(N, HV, V, dtype=torch.bfloat16, device="cuda"), Workspace("cuda")

    def step():
        return decode(q, k, v, A_log, a, b, dt_bias, pool, idx, out=out, workspace=ws)

    assert_allocates_nothing(step, "decode")
    start = pool.clone()
    replayed, replayed_pool = replay_then_eager(step, out, pool, start, lambda: q.copy_(randn(N, H, K)))
    assert torch.isfinite(replayed[idx >= 0].float()).all()
    assert_equal(replayed[idx >= 0], out[idx >= 0])
    assert_equal(replayed_pool, pool)
    assert torch.equal(pool[[2, 4, 6, 7]], start[[2, 4, 6, 7]]), "slots no sequence names changed"


@pytest.mark.parametrize("kernel", ["triton-gdn", "triton-gdn-sm90"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_spec_decode_allocates_nothing_and_replays_in_a_cuda_graph(state_dtype, kernel):
    from optimized import gdn_dispatch
    from optimized.triton.gdn_recurrent import Workspace

    g = torch.Generator(device="cuda").manual_seed(1)
    H, HV, K, V, S = 4, 8, 128, 128, 12
    lens = [3, 2, 1, 3]
    T = sum(lens)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    q, k, v, a, b = randn(T, H, K), randn(T, H, K), randn(T, HV, V), randn(T, HV), randn(T, HV)
    A_log, dt_bias = randn(HV, dtype=torch.float32), randn(HV)
    pool = randn(S, HV, K, V, dtype=state_dtype)
    # sequence 1 resumes from a padding slot (skipped); slots 0, 4, 5, 10, 11 written by no sequence
    spec = torch.tensor([[3, 7, 1], [-1, 4, 10], [9, -1, -1], [6, 8, 2]], dtype=torch.int32, device="cuda")
    acc = torch.tensor([2, 1, 1, 3], dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, 3, 5, 6, 9], dtype=torch.int32, device="cuda")
    out, ws = torch.empty(T, HV, V, dtype=torch.bfloat16, device="cuda"), Workspace("cuda")
    why = gdn_dispatch.problem(kernel, "spec_decode", q, v, pool)
    if why:
        pytest.skip(why)

    def step():
        return gdn_dispatch.spec_decode(q, k, v, A_log, a, b, dt_bias, pool, spec, acc, cu, out=out, workspace=ws,
                                        kernel=kernel)

    assert_allocates_nothing(step, "spec decode")
    start = pool.clone()

    def refresh():
        q.copy_(randn(T, H, K))
        out.fill_(float("nan"))

    replayed, replayed_pool = replay_then_eager(step, out, pool, start, refresh)
    assert torch.isfinite(replayed.float()).all()
    assert (replayed[3:5] == 0).all(), "the padded sequence's rows are not zero"
    assert_equal(replayed, out)
    assert_equal(replayed_pool, pool)
    assert torch.equal(pool[[0, 4, 5, 10, 11]], start[[0, 4, 5, 10, 11]]), "slots no sequence writes changed"
