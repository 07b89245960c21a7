"""Compile every Triton kernel of ``optimized/triton`` for GPU targets on a machine without a GPU
(Triton's ahead-of-time path: ``ASTSource`` plus ``GPUTarget``): the check behind "no CUDA-only
intrinsics, the same source must compile for ROCm", and a first step on a new architecture.

    python -m optimized.triton.compile_check                      # cuda:90 hip:gfx942 hip:gfx950
    python -m optimized.triton.compile_check --target hip:gfx950 --json

The kernels are those of every launcher in ``optimized.launchers.LAUNCHERS``: each launcher module's
``compile_specs()`` (beside its kernels) gives the argument types and constants it passes on a GPU (MMA
operands in the query's dtype: bf16 queries and outputs, and the fp16 MMA variants) for representative
shapes (TurboQuant: D=128, Hk=8, block size 16, the presets and layouts each kernel serves; GDN: Qwen3-Next's
heads, every op and state dtype) and the vendors it runs on: the NVIDIA-only Gluon decode (``tq_decode_sm90``:
inline PTX, ``mma.sync``) is compiled for the CUDA target only, with Gluon's ahead-of-time source
(``GluonASTSource``). A test holds every jit function of ``optimized/triton`` to a spec (or a spec'd kernel
that calls it). Needs a process without ``TRITON_INTERPRET=1`` (the interpreter replaces the kernels). Triton
bundles ``ptxas`` and links AMD code objects itself, so neither CUDA nor ROCm has to be installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from unittest import mock

TARGETS = {"cuda:90": ("cuda", 90, 32), "hip:gfx942": ("hip", "gfx942", 64), "hip:gfx950": ("hip", "gfx950", 64)}
# The representative cache of the TurboQuant specs: head size, kv heads, block size, query heads per kv head
D, HK, BS, G = 128, 8, 16, 8
HQ = HK * G
# Arguments the launcher's values make Triton specialise as multiples of 16 (pointers of fresh tensors,
# cache block strides, block-table rows), as a launch on a GPU does: the widths of the loads and of the
# cp.async copies depend on it.
ALIGNED = ("q_ptr", "cache_ptr", "bt_ptr", "seq_lens_ptr", "table_ptr", "sinks_ptr", "part_ptr", "stride_blk",
           "stride_bt")


@dataclass(frozen=True)
class CompileSpec:
    """One kernel configuration a launcher compiles: ``fn`` (a Triton or Gluon jit function) with the runtime
    argument ``types`` (Triton signature strings) and ``consts`` (constexpr values) its launcher passes on a
    GPU, for the ``vendors`` it runs on ("cuda", "hip"), in ``warps`` warps, the arguments in ``aligned``
    specialised as multiples of 16."""
    name: str
    fn: object
    types: dict
    consts: dict
    vendors: tuple[str, ...] = ("cuda", "hip")
    warps: int = 4
    aligned: tuple[str, ...] = ()


def cache_spec(preset: str, layout: str):
    """The ``CacheSpec`` of the representative cache (D, HK, BS) in ``preset`` and ``layout``."""
    from optimized.triton.tq_cache import CacheSpec
    from reference.turboquant.presets import preset as lookup

    return CacheSpec(lookup(preset), D, HK, BS, layout)


def kernels() -> list[CompileSpec]:
    """Every kernel configuration of every Triton launcher (``optimized.launchers.LAUNCHERS``: each module's
    ``compile_specs()``)."""
    from optimized import launchers

    return [spec for name in launchers.LAUNCHERS for spec in launchers.module(name).compile_specs()]


def compiled(fn, types: dict, consts: dict, target: str, num_warps: int = 4, num_stages: int = 3, aligned=()):
    """The compiled kernel of ``fn`` (a Triton or Gluon function) for ``target`` (a key of TARGETS), the
    arguments named in ``aligned`` specialised as multiples of 16: ``.asm`` holds every stage (``ttgir``,
    ``ptx``/``amdgcn``, ``cubin``/``hsaco``). Raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    source = GluonASTSource if getattr(fn, "is_gluon", lambda: False)() else ASTSource
    signature = {name: ("constexpr" if name in consts else types[name]) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in aligned}
    return triton.compile(source(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                          target=GPUTarget(*TARGETS[target]),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_one(fn, types: dict, consts: dict, target: str, num_warps: int = 4, aligned=()) -> dict:
    """Compile ``fn`` for ``target`` (a key of TARGETS); the binary's kind and size, or the error."""
    missing = [n for n in fn.arg_names if n not in consts and n not in types]
    if missing:
        return {"ok": False, "error": f"no type for argument(s) {missing}"}
    t0 = time.perf_counter()
    # A fresh cache: a cached code object would skip the compile and with it the diagnostics.
    with (tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": cache}),
          _stderr_of_native_code() as diagnostics):
        try:
            k = compiled(fn, types, consts, target, num_warps, aligned=aligned)
        except Exception as exc:  # reported per kernel: one failure does not hide the others
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    errors = [line for line in diagnostics.text().splitlines() if "error" in line.lower()]
    if errors:  # LLVM's AMDGPU back end reports some errors (bad inline asm) only on stderr
        return {"ok": False, "error": "; ".join(errors)[:2000]}
    kind = "cubin" if "cubin" in k.asm else "hsaco"
    binary = k.asm[kind]
    return {"ok": binary[:4] == b"\x7fELF", "binary": kind, "bytes": len(binary),
            "seconds": round(time.perf_counter() - t0, 2)}


class _stderr_of_native_code:
    """Captures what native code writes to file descriptor 2 inside the ``with`` block."""

    def __enter__(self):
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False

    def text(self) -> str:
        self._file.seek(0)
        return self._file.read().decode(errors="replace")


def run(targets) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_check needs a process without TRITON_INTERPRET=1")
    specs = kernels()
    return {t: {s.name: compile_one(s.fn, s.types, s.consts, t, s.warps, s.aligned) for s in specs
                if TARGETS[t][0] in s.vendors} for t in targets}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    res = run(args.target)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for t, rows in res.items():
            for name, r in rows.items():
                what = f"{r['binary']} {r['bytes']} bytes, {r['seconds']} s" if r["ok"] else r.get("error", "not ELF")
                print(f"{t:11} {name:40} {'ok ' if r['ok'] else 'FAIL'} {what}")
    return 0 if all(r["ok"] for rows in res.values() for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
