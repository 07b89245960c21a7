"""The chunked prefill's prep kernel variants (``bench.probes.gdn_chunked_prep.VARIANTS``) and the readout kernel
compiled for sm_90 on a machine without a GPU (``optimized.triton.compile_check``'s ahead-of-time path, pointers
and strides specialised as multiples of 16 as a launch specialises them), each read back from its cubin with
the ``cuobjdump`` Triton bundles: registers a thread, spill bytes (stack), shared memory, and the static SASS
instruction counts a warp (all, FFMA, HGMMA, BAR, LDS/LDSM + STS, local loads and stores), with the static
instructions per value head (a warp's count x warps / value heads a program). Static counts: a loop body counts
once. Prints one line per kernel:

    python -m bench.probes.gdn_chunked_sass [--variants NAME ...]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *flags, f.name], capture_output=True, text=True, check=True).stdout


def counts(fn, consts: dict, warps: int, registers: int | None = None) -> dict:
    """Resources and static SASS counts of ``fn`` (a kernel of ``gdn_chunked`` with a compile spec) at ``consts``
    (over its spec's), ``warps`` and a ``registers`` cap (maxnreg)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optimized.triton import gdn_chunked
    from optimized.triton.compile_check import TARGETS

    spec = next(s for s in gdn_chunked.compile_specs() if s.fn is fn)
    consts = {**spec.consts, **consts}
    signature = {n: ("constexpr" if n in consts else spec.types[n]) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in consts and (spec.types[n].startswith("*") or (n.startswith("s") and n != "scale"))}
    options = {"num_warps": warps, "num_stages": 3, **({} if registers is None else {"maxnreg": registers})}
    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                       target=GPUTarget(*TARGETS["cuda:90"]), options=options)
    usage = _cuobjdump(k.asm["cubin"], "--dump-resource-usage")
    ops = collections.Counter(m.group(1) for m in re.finditer(
        r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", _cuobjdump(k.asm["cubin"], "-sass"), re.M))
    return dict(regs=int(re.search(r"REG:(\d+)", usage).group(1)), stack=int(re.search(r"STACK:(\d+)", usage).group(1)),
                shared=k.metadata.shared, total=sum(ops.values()), FFMA=ops["FFMA"], HGMMA=ops["HGMMA"],
                BAR=ops["BAR"], LDS_STS=ops["LDS"] + ops["LDSM"] + ops["STS"], LDL_STL=ops["LDL"] + ops["STL"])


def main(argv=None) -> int:
    from bench.probes.gdn_chunked_prep import VARIANTS
    from optimized.triton import gdn_chunked as C

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="names of the prep probe's VARIANTS")
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        print(f"--variants: unknown {unknown}; expected names of {list(VARIANTS)}")
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1: the interpreter replaces the kernels; run without it")
        return 2
    print(f"{'kernel':31} {'regs':>4} {'stack':>5} {'smem':>6} {'instr/warp':>10} {'FFMA':>5} {'HGMMA':>5} "
          f"{'BAR':>4} {'LDS+STS':>7} {'LDL+STL':>7} {'instr/value head':>16}")
    rows = [("readout kernel", C._readout_kernel, {}, C.WARPS, None, 1)]
    for name in args.variants:
        v = VARIANTS[name]
        heads = v.get("prep_heads", C.PREP_HEADS)
        consts = dict(HEADS=heads, READOUT=v.get("prep_readout", C.PREP_READOUT),
                      RCP=v.get("prep_norm", C.PREP_NORM) == "rcp", FORM=v.get("prep_form", C.PREP_FORM))
        rows.append((f"prep {name}", C._prep_tiles_kernel, consts, v.get("prep_warps", C.PREP_WARPS),
                     v.get("prep_registers"), heads))
    for name, fn, consts, warps, registers, heads in rows:
        try:
            c = counts(fn, consts, warps, registers)
        except Exception as exc:
            print(f"{name:31} FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        print(f"{name:31} {c['regs']:4} {c['stack']:5} {c['shared']:6} {c['total']:10} {c['FFMA']:5} "
              f"{c['HGMMA']:5} {c['BAR']:4} {c['LDS_STS']:7} {c['LDL_STL']:7} {c['total'] * warps // heads:16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
