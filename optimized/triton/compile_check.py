"""Compile every Triton kernel of ``optimized/triton`` for GPU targets on a machine without a GPU
(Triton's ahead-of-time path: ``ASTSource`` plus ``GPUTarget``): the check behind "no CUDA-only
intrinsics, the same source must compile for ROCm", and a first step on a new architecture.

    python -m optimized.triton.compile_check                      # cuda:90 hip:gfx942 hip:gfx950
    python -m optimized.triton.compile_check --target hip:gfx950 --json

Each kernel is compiled with the argument types and constants its launcher passes on a GPU
(MMA operands in the query's dtype: bf16 queries and outputs, and the fp16 MMA variants of the grouped
decode and unified attention) for representative caches: D=128, Hk=8, block size 16, the presets and
layouts each kernel serves; the GDN kernels (``gdn_kernels``) for every op and state dtype. The NVIDIA-only Gluon
kernels (the TurboQuant decode ``tq_decode_sm90``: inline PTX, ``mma.sync``; the GDN decode ``gdn_decode_sm90`` for
each state dtype) are compiled for the CUDA target only, with Gluon's ahead-of-time source (``GluonASTSource``). Needs a process without
``TRITON_INTERPRET=1`` (the interpreter replaces the kernels). Triton bundles ``ptxas`` and links
AMD code objects itself, so neither CUDA nor ROCm has to be installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from unittest import mock

TARGETS = {"cuda:90": ("cuda", 90, 32), "hip:gfx942": ("hip", "gfx942", 64), "hip:gfx950": ("hip", "gfx950", 64)}
D, HK, BS, G = 128, 8, 16, 8
HQ = HK * G


def _spec(preset: str, layout: str):
    from optimized.triton.tq_cache import CacheSpec
    from reference.turboquant.presets import preset as lookup

    return CacheSpec(lookup(preset), D, HK, BS, layout)


def kernels() -> list[tuple[str, object, dict, dict]]:
    """(name, jit function, runtime argument types, constants) of every kernel configuration."""
    from optimized.triton import tq_decode_launch, tq_decode_grouped, tq_decode_split, tq_store, tq_unified

    out = []
    for preset, layout in (("turboquant_4bit_nc", "soa"), ("turboquant_k3v4_nc", "aos"),
                           ("turboquant_3bit_nc", "soa"), ("turboquant_k8v4", "aos")):
        spec = _spec(preset, layout)
        fp8 = spec.preset.key_fp8
        tag = f"{preset}/{layout}"
        out.append((f"store {tag}", tq_store._store_kernel, dict(
            cache_ptr="*u8", y_ptr="*fp32", norm_ptr="*fp32", k8_ptr="*u8" if fp8 else "*fp32", v_ptr="*bf16",
            slot_ptr="*i64", mid_ptr="*fp32", cent_ptr="*fp32", stride_blk="i32", stride_pos="i32",
            stride_head="i32", sv_n="i32", sv_h="i32", sv_d="i32"),
            dict(FOLD_NORM=spec.soa and spec.preset.norm_correction, BLOCK_H=HK, **spec.constexprs())))
        out.append((f"split decode {tag}", tq_decode_split._split_kernel, dict(
            q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", cent_ptr="*fp32",
            sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_pos="i32", stride_head="i32",
            stride_bt="i32", scale="fp32"),
            dict(HQ=HQ, G=G, S=4, MAXS=32, NORM_AT_DECODE=(not spec.soa) and spec.preset.norm_correction,
                 HAS_SINKS=True, BLOCK_N=32, **spec.constexprs())))
    spec = _spec("turboquant_4bit_nc", "soa")
    for keys, mma in (("gather", "bf16"), ("pair", "bf16"), ("gather", "fp16")):
        out.append((f"grouped decode keys={keys} mma={mma}", tq_decode_grouped._grouped_kernel, dict(
            q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", table_ptr="*i32",
            sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_bt="i32", scale="fp32"),
            dict(D=D, HK=HK, BS=BS, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes, HQ=HQ, G=G, S=4, MAXS=32,
                 HAS_SINKS=True, GP=G, BLOCK_N=128, KEYS=keys, TABLE=256 if keys == "pair" else 16, MMA=mma)))
    for mma, out_type in (("bf16", "*bf16"), ("fp16", "*fp16")):
        out.append((f"unified attention mma={mma}", tq_unified._unified_kernel, dict(
            q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", qsl_ptr="*i32", seq_lens_ptr="*i32", cent_ptr="*fp32",
            sinks_ptr="*fp32", out_ptr=out_type, stride_blk="i32", stride_bt="i32", so_t="i32", so_h="i32",
            scale="fp32"),
            dict(HQ=HQ, G=G, HAS_SINKS=True, BLOCK_M=64, BLOCK_Q=64 // G, BLOCK_N=32, MMA=mma, **spec.constexprs())))
    out += gdn_kernels()
    out.append(("validate", tq_decode_launch._validate_kernel, dict(
        q_ptr="*bf16", bt_ptr="*i32", seq_lens_ptr="*i32", sinks_ptr="*fp32", flags_ptr="*i32", stride_bt="i32",
        num_blocks="i32"), dict(ROWS_PER_SEQ=1, M=512, BS=BS, HQD=HQ * D, HQ=HQ, HAS_SINKS=True, CHUNK=256)))
    out.append(("rotate", tq_decode_launch._rotate_kernel, dict(
        q_ptr="*bf16", r_ptr="*fp32", out_ptr="*fp32", sq_b="i32", sq_h="i32", ROWS="i32"),
        dict(HQ=HQ, D=D, ROTATE=True, BLOCK_R=tq_decode_launch.ROTATE_ROWS, CHUNK=tq_decode_launch.ROTATE_CHUNK)))
    out.append(("reduce", tq_decode_launch._reduce_kernel, dict(
        part_ptr="*fp32", seq_lens_ptr="*i32", out_ptr="*bf16", so_b="i32", so_h="i32"),
        dict(HQ=HQ, D=D, S=4, MAXS=32, S_P2=4, ALIGN=128)))
    return out


# Arguments the launcher's values make Triton specialise as multiples of 16 (pointers of fresh tensors,
# cache block strides, block-table rows), as a launch on a GPU does: the widths of the loads and of the
# cp.async copies depend on it.
ALIGNED = ("q_ptr", "cache_ptr", "bt_ptr", "seq_lens_ptr", "table_ptr", "sinks_ptr", "part_ptr", "stride_blk",
           "stride_bt", "k_ptr", "v_ptr", "o_ptr", "state_ptr", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "so_t",
           "so_h", "s_slot")
# (G, block size, MMA operands, VALUES, STAGES) of the sm_90 decode configurations compiled
SM90_CONFIGS = ((G, BS, "bf16", 0, 1), (G, BS, "bf16", 0, 4), (G, BS, "fp16", 1, 1), (G, BS, "fp16", 2, 4),
                (16, 32, "bf16", 0, 3), (16, 32, "fp16", 1, 1))


def gdn_kernels() -> list[tuple[str, object, dict, dict]]:
    """The GDN kernels at Qwen3-Next's heads (H=16, HV=32, K=V=128) with bf16 activations and o: decode and
    spec decode (fused gating) and recurrent, for each state dtype, and the NaN/Inf flag kernel."""
    from optimized.triton import gdn_recurrent

    strides = {n: "i32" for n in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sx_t", "sy_t", "so_t", "so_h",
                                  "s_slot", "s_table", "interval")}
    out = []
    for op, gated, spec in (("decode", True, False), ("spec_decode", True, True), ("recurrent", False, False)):
        for state in ("fp32", "bf16", "fp16"):
            types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", x_ptr="*bf16" if gated else "*fp32",
                         y_ptr="*bf16", A_log_ptr="*fp32", dt_bias_ptr="*bf16", state_ptr=f"*{state}",
                         table_ptr="*i32", cu_ptr="*i32", acc_ptr="*i32", o_ptr="*bf16", scale="fp32", eps="fp32",
                         **strides)
            BK, BV, _ = gdn_recurrent._config(128, 128, None, None)
            out.append((f"gdn {op} state={state}", gdn_recurrent._gdn_kernel, types,
                        dict(H=16, HV=32, K=128, V=128, BK=BK, BV=BV, GATED=gated, SPEC=spec, VARLEN=spec or not gated,
                             L2NORM=True, BF16_BITS=False)))
    out += gdn_chunked_kernels()
    out.append(("gdn nonfinite flags", gdn_recurrent._nonfinite_kernel, dict(
        x_ptr="*bf16", flags_ptr="*i32", flag="i32", rows="i32", B="i32", s0="i32", s1="i32"),
        dict(C=128, BLOCK_R=64, BLOCK_C=128)))
    return out


def gdn_chunked_kernels() -> list[tuple[str, object, dict, dict]]:
    """The four stages of the GDN chunked prefill at Qwen3-Next's heads (H=16, HV=32, K=V=128), bf16 activations
    and o, for each state dtype (the state pass; the other stages do not read the pool)."""
    from optimized.triton import gdn_chunked as gc

    i32 = "i32"
    common = dict(cu_ptr="*i32", chunk_cu_ptr="*i32", idx_ptr="*i32", G_ptr="*fp32", N=i32, H=i32, HV=i32,
                  eps="fp32")
    strides = {n: i32 for n in ("sk_t", "sk_h", "sg_t", "sb_t", "sG_t", "sT_t", "sv_t", "sv_h", "sW_t", "sU_t",
                                "sq_t", "sq_h", "so_t", "so_h", "s_slot", "interval")}
    act = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", g_ptr="*fp32", beta_ptr="*bf16", T_ptr="*bf16",
               W_ptr="*bf16", U_ptr="*bf16", h_ptr="*bf16", vn_ptr="*bf16", o_ptr="*bf16", scale="fp32")
    BK, BV = gc._blocks(128, 128)
    consts = dict(K=128, BK=BK, L2NORM=True, BITS=False)
    out = [("gdn chunked solve", gc._solve_kernel, {**common, **strides, **act}, consts),
           ("gdn chunked w/u", gc._wu_kernel, {**common, **strides, **act}, dict(consts, V=128, BV=BV)),
           ("gdn chunked output", gc._output_kernel, {**common, **strides, **act}, dict(consts, V=128, BV=BV))]
    for state in ("fp32", "bf16", "fp16"):
        out.append((f"gdn chunked state pass state={state}", gc._state_kernel,
                    {**common, **strides, **act, "state_ptr": f"*{state}"}, dict(consts, V=128, BV=gc.STATE_BV)))
    return out


def nvidia_kernels() -> list[tuple[str, object, dict, dict, int]]:
    """(name, Gluon function, runtime argument types, constants, warps) of the NVIDIA-only kernels:
    the sm_90 decode at the issue's shape (G=8, block 16) and at G=16 with block 32, bf16 and fp16
    operands (both fp16 value codes), register prefetch (stages 1) and cp.async rings."""
    from optimized.triton import tq_decode_sm90

    spec = _spec("turboquant_4bit_nc", "soa")
    types = dict(q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", table_ptr="*i32",
                 sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_bt="i32", scale="fp32")
    out = []
    for g, bs, mma, values, stages in SM90_CONFIGS:
        out.append((f"sm90 decode G={g} block={bs} mma={mma} values={tq_decode_sm90.VALUE_CODES[values]} "
                    f"stages={stages}", tq_decode_sm90._sm90_kernel, types,
                    dict(D=D, HK=HK, BS=bs, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes, HQ=HK * g, G=g, S=4,
                         MAXS=32, HAS_SINKS=True, BLOCK_N=16, VALUES=values, STAGES=stages), 1))
    return out + gdn_sm90_kernels()


def gdn_sm90_kernels() -> list[tuple[str, object, dict, dict, int]]:
    """The sm_90 GDN decode (``gdn_decode_sm90``) at Qwen3-Next's heads (H=16, HV=32, K=V=128), bf16
    activations and o, its default configuration for each state dtype."""
    from optimized.triton import gdn_decode_sm90 as gd

    i32 = "i32"
    out = []
    for state, size in (("fp32", 4), ("bf16", 2), ("fp16", 2)):
        types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16", A_log_ptr="*fp32",
                     dt_bias_ptr="*bf16", state_ptr=f"*{state}", table_ptr="*i32", o_ptr="*bf16", scale="fp32",
                     eps="fp32", **{n: i32 for n in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sa_t", "sb_t",
                                                      "so_t", "so_h", "s_slot")})
        vec, lanes, warps, hpp = gd.config(size, 128, 2)
        out.append((f"sm90 gdn decode state={state}", gd._decode_kernel, types,
                    dict(H=16, HV=32, K=128, V=128, HPP=hpp, VEC=vec, LANES=lanes, WARPS=warps, PREFETCH=False,
                         L2NORM=True), warps))
    return out


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
    res = {}
    for t in targets:
        res[t] = {name: compile_one(fn, types, consts, t) for name, fn, types, consts in kernels()}
        if TARGETS[t][0] == "cuda":
            res[t].update({name: compile_one(fn, types, consts, t, warps, ALIGNED) for name, fn, types, consts, warps
                           in nvidia_kernels()})
    return res


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
