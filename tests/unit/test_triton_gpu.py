"""GPU-only properties of the Triton TurboQuant decode: a decode with a preallocated workspace and
output allocates nothing per call, and can be captured in a CUDA graph whose replay recomputes
the result for new query values (the same numbers as an eager call)."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
    reason="needs a CUDA/ROCm GPU (not the interpreter)")

PRESET = "turboquant_4bit_nc"


def _case(B=4, Hk=2, G=4, D=128, L=300, bs=16, dtype="bfloat16"):
    from reference.turboquant.presets import preset
    from reference.turboquant.rotation import random_rotation
    from optimized.triton.tq_store import store

    g = torch.Generator(device="cuda").manual_seed(0)
    nblocks = B * -(-L // bs) + 1
    cache = torch.zeros(nblocks, bs, Hk, preset(PRESET).slot_size(D), dtype=torch.uint8, device="cuda")
    rot = torch.from_numpy(random_rotation(D, 3)).cuda()
    n = nblocks * bs
    store(cache, torch.randn(n, Hk, D, generator=g, device="cuda"), torch.randn(n, Hk, D, generator=g, device="cuda"),
          torch.arange(n, device="cuda"), preset=PRESET, layout="soa", rotation=rot)
    bt = torch.randperm(nblocks, generator=g, device="cuda")[: B * -(-L // bs)].view(B, -1).to(torch.int32)
    lens = torch.tensor([L, L // 2, 1, L - 7][:B], dtype=torch.int32, device="cuda")
    q = torch.randn(B, Hk * G, D, generator=g, device="cuda", dtype=getattr(torch, dtype))
    return q, cache, bt, lens, rot


@pytest.mark.parametrize("kernel", ["split", "grouped", "grouped-pair", "sm90", "sm90-fp16", "sm90-regs"])
def test_decode_allocates_nothing_and_replays_in_a_cuda_graph(kernel):
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_grouped import decode_grouped
    from optimized.triton.tq_decode_sm90 import decode_sm90, device_problem
    from optimized.triton.tq_decode_split import decode_split

    if kernel.startswith("sm90") and device_problem(torch.device("cuda")):
        pytest.skip(device_problem(torch.device("cuda")))
    fn = decode_split if kernel == "split" else decode_sm90 if kernel.startswith("sm90") else decode_grouped
    q, cache, bt, lens, rot = _case(dtype="float16" if kernel == "sm90-fp16" else "bfloat16")
    ws = DecodeWorkspace(8, q.shape[1], q.shape[2], max_splits=8)
    out = torch.empty_like(q)
    kw = dict(preset=PRESET, layout="soa", rotation=rot, workspace=ws, out=out, num_kv_splits=4)
    if kernel == "grouped-pair":
        kw["keys"] = "pair"
    if kernel == "sm90-regs":
        kw["stages"] = 1
    fn(q, cache, bt, lens, **kw)  # compile, build the centroid tables, run the checks
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    fn(q, cache, bt, lens, **kw)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "a repeated decode allocated"

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn(q, cache, bt, lens, **kw)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    fn(q, cache, bt, lens, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(replayed).all()
    np.testing.assert_array_equal(replayed.float().cpu().numpy(), out.float().cpu().numpy())


@pytest.mark.parametrize("dtype,block_n", [("bfloat16", 16), ("bfloat16", 32), ("float16", 16)])
def test_sm90_ring_computes_what_the_register_path_does(dtype, block_n):
    """The cp.async ring (stages 4) and the register prefetch (stages 1) do the same arithmetic in the same
    order: bit-identical outputs, with the last tile of a split holding every count of live tokens mod 16
    (a count of 2 mod 4 once read the value row of a dead token's block-table entry)."""
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_sm90 import decode_sm90, device_problem

    if device_problem(torch.device("cuda")):
        pytest.skip(device_problem(torch.device("cuda")))
    q, cache, bt, lens, rot = _case(B=16, L=300, dtype=dtype)
    lens = torch.arange(300, 284, -1, dtype=torch.int32, device="cuda")
    outs = []
    for stages in (1, 4):
        ws = DecodeWorkspace(16, q.shape[1], q.shape[2], max_splits=8)
        outs.append(decode_sm90(q, cache, bt, lens, preset=PRESET, layout="soa", rotation=rot, workspace=ws,
                                num_kv_splits=3, block_n=block_n, stages=stages).float().cpu().numpy())
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[1], outs[0])
