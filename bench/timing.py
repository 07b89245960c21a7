"""Timing. CPU: interleaved ``perf_counter`` repetitions (A B C A B C ...), so that every callable
sees the same machine load, after one warm-up call each. GPU: samples, each the median of CUDA-graph
replays over ``SAMPLE_MS`` timed by device events (``triton.testing.do_bench``, the L2 cache cleared
before each replay), after one eager call, the capture (``capture``) and ``WARMUP_MS`` of warm-up
replays before the first sample; or the same samples of eager calls (``cuda_events``), the check of
what a captured call measures.

The windows are short so that the A/A pairs of the gated GPU rows (``kernel-lab bench --aa``) fit in
one device call, and a normal run uses the same windows, so that its gates judge the statistic whose
noise the A/A pairs measured. Per row and run: 10 ms of warm-up and 5 samples of 30 ms (it was 25 ms
of warm-up before each of 5 samples of 100 ms, 625 ms a row). On an H200 (2026-12-06) the 100 ms
samples of the gated rows spread by 0.06% (the copy ceiling) to 0.25% (TurboQuant sm_90 decode,
L=8192) and up to 1% at L=32768, min to max over 5 samples; a median over 30 ms has about 30/100
the replays, so its spread grows by at most sqrt(100/30) = 1.8x, to under 2%: within the regression
gates' smallest threshold (1.05) and far from the in-run gates' thresholds. The 44 gated rows of the
H200 x 40 runs of an A/A take about 44 x 40 x 0.185 s = 326 s (``gpu_row_seconds``), where the old
windows took 0.69 s a row, 21 minutes.
"""
from __future__ import annotations

import time

import numpy as np

WARMUP_MS = 10          # warm-up replays before the first sample of a row
SAMPLE_MS = 30          # each sample: the median of the replays over this window
SAMPLE_OVERHEAD_MS = 5  # per sample, do_bench's own work (its 5-replay estimate, events, synchronisation): an
                        # allowance; on the H200 a row took 0.69 s for 0.625 s of windows, set-up included


def gpu_row_seconds(reps: int) -> float:
    """The wall time of one GPU row's ``reps`` samples (warm-up included): the plan of an A/A."""
    return (WARMUP_MS + reps * (SAMPLE_MS + SAMPLE_OVERHEAD_MS)) / 1e3


def interleaved(fns: dict, reps: int) -> dict[str, np.ndarray]:
    """Seconds of each of ``reps`` calls of every fn, called in turn."""
    if reps < 1:
        raise ValueError(f"reps: expected >= 1, got {reps}")
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: np.array(t) for name, t in times.items()}


def capture(fn):
    """``fn`` called once eagerly, then captured in a CUDA graph: the graph's ``replay`` (which keeps the
    graph, and the memory of its pool, alive as long as it is held)."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return graph.replay


def eager(fn):
    """``fn`` called once eagerly (compiles and first-touch allocations out of the timed calls), then itself."""
    import torch

    fn()
    torch.cuda.synchronize()
    return fn


def samples(fn, reps: int, sample_ms: int = SAMPLE_MS, warmup_ms: int = WARMUP_MS) -> np.ndarray:
    """Seconds of ``reps`` samples of a ready call (``capture``'s replay or ``eager``'s call), each the median
    of ``do_bench``'s calls over ``sample_ms``; ``warmup_ms`` of warm-up calls before the first sample only."""
    import triton

    if reps < 1:
        raise ValueError(f"reps: expected >= 1, got {reps}")
    return np.array([triton.testing.do_bench(fn, warmup=warmup_ms if i == 0 else 0, rep=sample_ms,
                                             return_mode="median") * 1e-3 for i in range(reps)])


def cuda_graph(fn, reps: int, rep_ms: int = SAMPLE_MS, warmup_ms: int = WARMUP_MS) -> np.ndarray:
    """``samples`` of the CUDA-graph replays of ``fn`` (captured here)."""
    return samples(capture(fn), reps, rep_ms, warmup_ms)


def cuda_events(fn, reps: int) -> np.ndarray:
    """``samples`` of eager calls of ``fn``, each call timed by its own pair of device events."""
    return samples(eager(fn), reps)


def summary(seconds: np.ndarray) -> dict:
    return {"min": float(np.min(seconds)), "median": float(np.median(seconds)),
            "max": float(np.max(seconds)), "n": int(len(seconds))}
