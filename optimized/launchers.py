"""Every GPU kernel launcher of ``optimized/``, one table: ``LAUNCHERS``, name -> (family, module).

A launcher module exports, beside its kernels:

- ``problem(**request)``: why it cannot serve a request, or None; the keywords are its family's
  (``PROBLEM_KEYWORDS``), so a dispatcher asks every launcher of a family the same question;
- ``ENTRY_POINTS``: op -> function, called with the family's arguments (torch tensors; the reference's
  names) and launch options;
- ``compile_specs()``: the Triton and Gluon kernels it launches, with the argument types and constants it
  passes on a GPU (``optimized.triton.compile_check.CompileSpec``), which the ahead-of-time compile check
  builds for CUDA and ROCm; a launcher of other kernels (FlyDSL) returns none.

Within a family the table is in order of preference, fastest first: the dispatchers (``tq_dispatch``,
``gdn_dispatch``) run the first launcher of the family whose entry points hold the op and whose
``problem`` says None. A new launcher is one module and one entry here.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple


class Launcher(NamedTuple):
    family: str
    module: str


LAUNCHERS = {
    # TurboQuant (H200 measurements in ledger/h200/README.md)
    "triton-sm90": Launcher("turboquant", "optimized.triton.tq_decode_sm90"),
    "flydsl-gfx950": Launcher("turboquant", "optimized.flydsl.launcher"),
    "triton-grouped": Launcher("turboquant", "optimized.triton.tq_decode_grouped"),
    "triton-split": Launcher("turboquant", "optimized.triton.tq_decode_split"),
    "triton-unified": Launcher("turboquant", "optimized.triton.tq_unified"),
    "triton-store": Launcher("turboquant", "optimized.triton.tq_store"),
    # GDN. The sm_90 decode (Gluon) first: on the H100 it passes the full tier and its checks and runs a
    # 16-bit pool at 89-90% of the in-run copy against the portable kernel's 82-83%, fp32 at the same 94%
    # (ledger/h100/README.md); it serves spec_decode too, and leaves what it does not serve (recurrent, other
    # head sizes) to the portable kernel
    "triton-gdn-sm90": Launcher("gdn", "optimized.triton.gdn_decode_sm90"),
    "triton-gdn": Launcher("gdn", "optimized.triton.gdn_recurrent"),
    "triton-gdn-chunked": Launcher("gdn", "optimized.triton.gdn_chunked"),
}

PROBLEM_KEYWORDS = {
    "turboquant": ("preset", "layout", "D", "block_size", "G", "sinks", "act", "device"),
    "gdn": ("K", "V", "state_dtype", "act", "H", "HV", "device"),
}


def module(name: str):
    """The launcher module of ``name`` (a key of ``LAUNCHERS``; else ValueError naming them)."""
    if name not in LAUNCHERS:
        raise ValueError(f"kernel must be one of {tuple(LAUNCHERS)}, got {name!r}")
    return importlib.import_module(LAUNCHERS[name].module)


def entry(name: str, op: str):
    """The function of launcher ``name`` that runs ``op``; ValueError naming the ops it has."""
    points = module(name).ENTRY_POINTS
    if op not in points:
        raise ValueError(f"kernel {name!r} runs {sorted(points)}, not {op!r}")
    return points[op]


def serving(family: str, op: str) -> tuple[str, ...]:
    """The launchers of ``family`` that have an entry point for ``op``, in the table's order."""
    return tuple(name for name, launcher in LAUNCHERS.items()
                 if launcher.family == family and op in module(name).ENTRY_POINTS)
