"""Timing. CPU: interleaved ``perf_counter`` repetitions (A B C A B C ...), so that every callable
sees the same machine load, after one warm-up call each. GPU: the median of CUDA-graph replays
timed by device events (``triton.testing.do_bench``), after an eager warm-up call; or the median of eager
calls timed by device events (``cuda_events``), the check of what a captured call measures."""
from __future__ import annotations

import time

import numpy as np


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


def cuda_graph(fn, reps: int, rep_ms: int = 100, warmup_ms: int = 25) -> np.ndarray:
    """Seconds of ``reps`` samples, each the median of ``do_bench``'s CUDA-graph replays of ``fn``
    over ``rep_ms`` (after ``warmup_ms`` of warm-up replays)."""
    import torch
    import triton

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return np.array([triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3
                     for _ in range(reps)])


def cuda_events(fn, reps: int) -> np.ndarray:
    """Seconds of ``reps`` samples, each the median of ``do_bench``'s eager calls of ``fn`` over 100 ms
    (after 25 ms of warm-up calls), each call timed by its own pair of device events."""
    import torch
    import triton

    fn()
    torch.cuda.synchronize()
    return np.array([triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
                     for _ in range(reps)])


def summary(seconds: np.ndarray) -> dict:
    return {"min": float(np.min(seconds)), "median": float(np.median(seconds)),
            "max": float(np.max(seconds)), "n": int(len(seconds))}
