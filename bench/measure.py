"""One measurement of a bench: every enabled implementation and ceiling at every selected shape,
timed in the same run, as records whose ``extra_info`` follows the perf-JSON schema.

CPU benches interleave all shapes and implementations (A B C A B C ...): ratios between them see
the same machine load. GPU benches take one shape at a time (its inputs may fill the device) and
time CUDA-graph replays (or, for an implementation whose ``timing`` is "events", eager calls timed with
device events). Throughput uses the minimum time on the CPU (the least disturbed call)
and the median on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench import machine, registry, timing


@dataclass
class Record:
    """``rid`` = ``bench/shape/impl``; ``samples`` the seconds of each repetition (in the
    interleaved order, so samples of one bench pair up by index); ``skip`` why it did not run."""
    rid: str
    extra_info: dict
    samples: np.ndarray | None = None
    skip: str | None = None


def rid(bench: str, shape: str, impl: str) -> str:
    return f"{bench}/{shape}/{impl}"


def measure(bench_name: str, shapes: list[str] | None = None, impls: list[str] | None = None,
            reps: int | None = None, tick=None) -> list[Record]:
    """Records of ``bench_name`` at ``shapes`` (default all) for ``impls`` (default all, ceilings
    included). ``tick(label)`` is called after each timed repetition (a progress bar)."""
    b = registry.benches()[bench_name]
    labels = list(b.shapes) if shapes is None else shapes
    for label in labels:
        if label not in b.shapes:
            raise KeyError(f"shape: {bench_name} has no shape {label!r} (known: {list(b.shapes)})")
    chosen = {n: i for n, i in registry.impls(bench_name).items() if impls is None or n in impls}
    reps = b.reps if reps is None else reps
    fp = machine.fingerprint(b.device)
    out: list[Record] = []
    plans = []
    for label in labels:
        shape = b.shapes[label]
        inputs = None
        calls = {}
        for name, impl in chosen.items():
            why = registry.capability(impl, shape)
            if why is not None:
                out.append(Record(rid(b.name, label, name), _info(b, label, impl, fp), skip=why))
                continue
            if inputs is None:
                inputs = b.inputs(shape)
            if impl.role != "peer":
                calls[name] = impl.prepare(shape, inputs)
                continue
            try:   # a peer that raises is a skip with its reason, not the end of the run
                fn = impl.prepare(shape, inputs)
                fn()
            except Exception as exc:
                out.append(Record(rid(b.name, label, name), _info(b, label, impl, fp),
                                  skip=f"{name} raised {type(exc).__name__}: {str(exc)[:300]}"))
                continue
            calls[name] = fn
        if b.device == "gpu":   # one shape's inputs on the device at a time
            times = {name: _gpu_times(fn, chosen[name].timing, reps, tick, f"{label}/{name}")
                     for name, fn in calls.items()}
            out.extend(_records(b, label, chosen, times, fp))
        else:
            plans.append((label, calls))
    if b.device == "cpu":
        flat = {(label, name): fn for label, calls in plans for name, fn in calls.items()}
        times = timing.interleaved(_ticking(flat, tick), reps)
        for label, calls in plans:
            out.extend(_records(b, label, chosen, {n: times[(label, n)] for n in calls}, fp))
    return out


def _ticking(fns: dict, tick):
    if tick is None:
        return fns
    return {key: (lambda fn=fn, key=key: (fn(), tick("/".join(key)))) for key, fn in fns.items()}


def _gpu_times(fn, how: str, reps, tick, label):
    t = timing.cuda_graph(fn, reps) if how == "cuda-graph" else timing.cuda_events(fn, reps)
    if tick is not None:
        tick(label)
    return t


def _info(b, label: str, impl, fp: dict) -> dict:
    c = (impl.cost or b.cost)(b.shapes[label])
    return {"bench": b.name, "impl": impl.name, "role": impl.role, "shape": dict(b.shapes[label], label=label),
            "bytes": int(c.bytes), "flops": int(c.flops), "fingerprint": fp}


def _records(b, label: str, chosen: dict, times: dict, fp: dict) -> list[Record]:
    recs = {}
    for name, t in times.items():
        info = _info(b, label, chosen[name], fp)
        best = float(np.min(t)) if b.device == "cpu" else float(np.median(t))
        info.update(time_s=timing.summary(t), timing="cpu-interleaved" if b.device == "cpu" else chosen[name].timing,
                    gbps=info["bytes"] / best / 1e9, tflops=info["flops"] / best / 1e12)
        recs[name] = Record(rid(b.name, label, name), info, samples=t)
    ceilings = {n: r.extra_info for n, r in recs.items() if chosen[n].role == "ceiling"}
    for name, r in recs.items():
        info = r.extra_info
        info["ceilings"] = {n: {chosen[n].metric: c[chosen[n].metric]} for n, c in ceilings.items()}
        info["fraction_of"] = {n: info[chosen[n].metric] / c[chosen[n].metric]
                               for n, c in ceilings.items() if c[chosen[n].metric] > 0}
    return list(recs.values())
