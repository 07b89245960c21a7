"""The benchmark registry: per family op a ``Bench`` (shapes, cost model, shared inputs, the
ceilings that match its access pattern) and its implementations side by side (``Impl``: ours,
the torch baselines, peers), each enabled by a capability check that says why not.

A peer registers with ``register_impl(Impl(...))`` from its own module in ``bench/peers/``.
Record ids are ``bench/shape/impl``, e.g. ``gdn/decode/state=bfloat16/cpu``.
"""
from __future__ import annotations

import importlib
import pkgutil
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from conformance.cost import Cost

ROLES = ("ours", "baseline", "peer", "ceiling")
TIMINGS = ("cuda-graph", "events")
BENCH_MODULES = ("bench.gdn_cpu", "bench.gdn_gpu", "bench.turboquant_gpu")


@dataclass(frozen=True)
class Bench:
    """One family op: ``shapes`` (label -> shape dict), ``cost(shape) -> Cost``,
    ``inputs(shape)`` (built once per shape, shared by every implementation), ``device``
    ("cpu" or "gpu"), ``reps`` (interleaved repetitions on the CPU)."""
    name: str
    device: str
    shapes: dict[str, dict]
    cost: Callable[[dict], Cost]
    inputs: Callable[[dict], Any]
    reps: int = 15


@dataclass(frozen=True)
class Impl:
    """One implementation (or ceiling) of a bench. ``prepare(shape, inputs)`` returns the
    no-argument callable that is timed (allocations happen in prepare, not in the call).
    ``available() -> (ok, reason)`` probes the machine; ``supports(shape) -> reason or None``.
    ``cost`` overrides the bench's cost model when the impl moves other bytes (a ceiling sized
    to the op, SDPA on an uncompressed cache); ``metric`` is the ceiling's unit, "gbps" or
    "tflops". ``timing`` (GPU benches): "cuda-graph" (replays of the call captured in a CUDA graph)
    or "events" (eager calls timed with device events: what a captured call is checked against)."""
    bench: str
    name: str
    role: str
    prepare: Callable[[dict, Any], Callable[[], Any]]
    available: Callable[[], tuple[bool, str]] = lambda: (True, "always")
    supports: Callable[[dict], str | None] = lambda shape: None
    cost: Callable[[dict], Cost] | None = None
    metric: str = "gbps"
    timing: str = "cuda-graph"

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {self.role!r}")
        if self.metric not in ("gbps", "tflops"):
            raise ValueError(f"metric: expected 'gbps' or 'tflops', got {self.metric!r}")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing: expected one of {TIMINGS}, got {self.timing!r}")


_BENCHES: dict[str, Bench] = {}
_IMPLS: dict[str, dict[str, Impl]] = {}
_LOADED = False


def register_bench(b: Bench) -> Bench:
    if b.device not in ("cpu", "gpu"):
        raise ValueError(f"device: expected 'cpu' or 'gpu', got {b.device!r}")
    _BENCHES[b.name] = b
    _IMPLS.setdefault(b.name, {})
    return b


def register_impl(impl: Impl) -> Impl:
    """Add an implementation to its bench (the hook peers use); a second one of the same name
    on the same bench is refused."""
    if impl.bench not in _BENCHES:
        raise ValueError(f"bench: no bench named {impl.bench!r} (known: {sorted(_BENCHES)})")
    if impl.name in _IMPLS[impl.bench]:
        raise ValueError(f"name: {impl.bench} already has an implementation named {impl.name!r}")
    _IMPLS[impl.bench][impl.name] = impl
    return impl


def unregister_impl(bench: str, name: str) -> None:
    del _IMPLS[bench][name]


@contextmanager
def registered(*impls: Impl):
    """Register ``impls`` for the duration of a with-block (test-only implementations)."""
    for impl in impls:
        register_impl(impl)
    try:
        yield
    finally:
        for impl in impls:
            unregister_impl(impl.bench, impl.name)


def load() -> None:
    """Import the modules that register the benches and their implementations, then every peer
    module of ``bench.peers`` (once)."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for mod in BENCH_MODULES:
            importlib.import_module(mod)
        from bench import peers
        for info in pkgutil.iter_modules(peers.__path__):
            importlib.import_module(f"bench.peers.{info.name}")


def benches() -> dict[str, Bench]:
    load()
    return dict(_BENCHES)


def impls(bench: str) -> dict[str, Impl]:
    load()
    if bench not in _IMPLS:
        raise KeyError(f"bench: no bench named {bench!r} (known: {sorted(_BENCHES)})")
    return dict(_IMPLS[bench])


def capability(impl: Impl, shape: dict) -> str | None:
    """None when ``impl`` runs here at ``shape``; else why not, in words."""
    try:
        ok, why = impl.available()
    except Exception as exc:  # a probe that raises is a reason, not a crash of the run
        return f"{impl.name}: availability probe raised {type(exc).__name__}: {exc}"
    if not ok:
        return why
    return impl.supports(shape)
