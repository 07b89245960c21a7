"""The steps the GPU-only kernel tests share: a repeated call allocates nothing on the device, and a call
captured in a CUDA graph and replayed for new inputs matches an eager call from the same pool."""
import numpy as np
import torch


def assert_allocates_nothing(step, what: str) -> None:
    """``step()`` once (it compiles), then again with no device allocation."""
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    step()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, f"a repeated {what} allocated"


def replay_then_eager(step, out, pool, start, refresh) -> tuple:
    """``step`` (compiled already) captured in a CUDA graph; the pool reset to ``start``, ``refresh()`` (new
    inputs written in place), the graph replayed; then the pool reset again and ``step`` called eagerly, which
    leaves its results in ``out`` and ``pool``. Returns (``out``, ``pool``) as the replay left them."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            step()
    pool.copy_(start)
    refresh()
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone(), pool.clone()
    pool.copy_(start)
    step()
    torch.cuda.synchronize()
    return replayed


def assert_equal(a, b) -> None:
    """Bit-equal device tensors (compared as float32 on the host)."""
    np.testing.assert_array_equal(a.float().cpu().numpy(), b.float().cpu().numpy())
