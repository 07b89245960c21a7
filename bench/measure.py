"""One measurement of a bench: every enabled implementation and ceiling at every selected shape,
timed in the same run, as records whose ``extra_info`` follows the perf-JSON schema.

A measurement is a set-up (``set_up``: inputs built, calls prepared) and its timing (``time_set_up``);
``measure`` does both. A GPU call is captured (or warmed up) right before it is first timed and released
after it, as each row was timed before set-ups existed, unless its set-up is kept: the A/A pairs of
``kernel-lab bench --aa`` set each row up once (``keep``), capture it at its first timing and replay
that capture in every later run.

CPU benches interleave all shapes and implementations (A B C A B C ...): ratios between them see
the same machine load. GPU benches take one shape at a time (its inputs may fill the device) and
time CUDA-graph replays (or, for an implementation whose ``timing`` is "events", eager calls timed with
device events). Throughput uses the minimum time on the CPU (the least disturbed call)
and the median on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench import machine, registry, timing
from bench.registry import Bench, Impl


@dataclass
class Record:
    """``rid`` = ``bench/shape/impl``; ``samples`` the seconds of each repetition (in the
    interleaved order, so samples of one bench pair up by index); ``skip`` why it did not run."""
    rid: str
    extra_info: dict
    samples: np.ndarray | None = None
    skip: str | None = None


@dataclass
class SetUp:
    """Rows of one bench ready to time: ``calls`` {(shape label, impl name): the prepared call}, ``skips``
    the records of the rows that do not run here. The calls hold their inputs (on the device for a GPU
    bench) as long as the set-up is held. ``keep``: a GPU call's capture (or warmed-up eager call) made at
    its first timing is kept in ``ready`` beside it, so later timings replay it. The prepared call stays in
    ``calls``: a CUDA graph holds no reference to the tensors it reads and writes, so its replay is safe only
    while the call that allocated them is held."""
    bench: Bench
    chosen: dict[str, Impl]
    labels: list[str]
    keep: bool = False
    calls: dict[tuple[str, str], object] = field(default_factory=dict)
    ready: dict[tuple[str, str], object] = field(default_factory=dict)
    skips: list[Record] = field(default_factory=list)


def rid(bench: str, shape: str, impl: str) -> str:
    return f"{bench}/{shape}/{impl}"


def set_up(bench_name: str, shapes: list[str] | None = None, impls: list[str] | None = None,
           keep: bool = False) -> SetUp:
    """``bench_name``'s rows at ``shapes`` (default all) for ``impls`` (default all, ceilings
    included), set up: inputs built once per shape and shared, each call prepared (a peer's called
    once: one that raises is a skip with its reason, not the end of the run); ``keep``: ``SetUp.keep``."""
    b = registry.benches()[bench_name]
    labels = list(b.shapes) if shapes is None else shapes
    for label in labels:
        if label not in b.shapes:
            raise KeyError(f"shape: {bench_name} has no shape {label!r} (known: {list(b.shapes)})")
    chosen = {n: i for n, i in registry.impls(bench_name).items() if impls is None or n in impls}
    fp = machine.fingerprint(b.device)
    out = SetUp(b, chosen, labels, keep)
    for label in labels:
        shape = b.shapes[label]
        inputs = None
        for name, impl in chosen.items():
            why = registry.capability(impl, shape)
            if why is not None:
                out.skips.append(Record(rid(b.name, label, name), _info(b, label, impl, fp), skip=why))
                continue
            if inputs is None:
                inputs = b.inputs(shape)
            try:
                fn = impl.prepare(shape, inputs)
                if impl.role == "peer":
                    fn()
            except Exception as exc:
                if impl.role != "peer":
                    raise
                out.skips.append(Record(rid(b.name, label, name), _info(b, label, impl, fp),
                                        skip=f"{name} raised {type(exc).__name__}: {str(exc)[:300]}"))
                continue
            out.calls[(label, name)] = fn
    return out


def time_set_up(s: SetUp, reps: int | None = None, tick=None) -> list[Record]:
    """Records of the set-up rows (its skips first): CPU rows interleaved, GPU rows one after another.
    ``tick(label)`` is called after each timed CPU repetition or GPU row (a progress bar)."""
    b = s.bench
    reps = b.reps if reps is None else reps
    fp = machine.fingerprint(b.device)
    if b.device == "cpu":
        times = timing.interleaved(_ticking(s.calls, tick), reps)
    else:
        times = {key: _gpu_times(s, key, reps, tick) for key in s.calls}
    out = [Record(r.rid, dict(r.extra_info), skip=r.skip) for r in s.skips]   # a run's own records
    for label in s.labels:
        out.extend(_records(b, label, s.chosen, {n: t for (lb, n), t in times.items() if lb == label}, fp))
    return out


def measure(bench_name: str, shapes: list[str] | None = None, impls: list[str] | None = None,
            reps: int | None = None, tick=None) -> list[Record]:
    """Records of ``bench_name`` at ``shapes`` (default all) for ``impls`` (default all, ceilings
    included): ``set_up`` and ``time_set_up``, a GPU bench one shape at a time (its inputs freed before the
    next shape's are built). ``tick(label)`` is called after each timed repetition (a progress bar)."""
    b = registry.benches()[bench_name]
    labels = list(b.shapes) if shapes is None else shapes
    if b.device == "gpu":
        return [r for label in labels for r in time_set_up(set_up(bench_name, [label], impls), reps, tick)]
    return time_set_up(set_up(bench_name, labels, impls), reps, tick)


def _ticking(fns: dict, tick):
    if tick is None:
        return fns
    return {key: (lambda fn=fn, key=key: (fn(), tick("/".join(key)))) for key, fn in fns.items()}


def _gpu_times(s: SetUp, key: tuple[str, str], reps: int, tick):
    """``reps`` samples of the GPU row ``key``: its capture (or warmed-up eager call), made now unless
    the set-up kept it from an earlier timing."""
    fn = s.ready.get(key)
    if fn is None:
        call = s.calls[key]
        fn = timing.capture(call) if s.chosen[key[1]].timing == "cuda-graph" else timing.eager(call)
        if s.keep:
            s.ready[key] = fn
    t = timing.samples(fn, reps)
    if tick is not None:
        tick("/".join(key))
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
