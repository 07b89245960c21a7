"""Every Triton kernel compiles for CUDA (sm_90) and for ROCm (gfx942, gfx950) on this GPU-less
machine (no CUDA-only intrinsics: the same source must compile for ROCm), checked with
Triton's ahead-of-time compiler (``optimized.triton.compile_check``). It runs in a subprocess
without ``TRITON_INTERPRET``, which the other Triton tests set and which replaces the kernels."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optimized.triton.compile_check import TARGETS

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"store", "split decode", "grouped decode keys=gather mma=bf16", "grouped decode keys=pair mma=bf16",
           "grouped decode keys=gather mma=fp16", "unified attention mma=bf16", "unified attention mma=fp16",
           "validate", "rotate", "reduce", "gdn nonfinite flags"} | {
    f"gdn {op} state={s}" for op in ("decode", "spec_decode", "recurrent") for s in ("fp32", "bf16", "fp16")} | {
    "gdn chunked solve", "gdn chunked w/u", "gdn chunked output"} | {
    f"gdn chunked state pass state={s}" for s in ("fp32", "bf16", "fp16")}
NVIDIA_ONLY = {"sm90 decode G=8 block=16 mma=bf16 values=bf16-offset stages=1",  # Gluon, inline PTX, mma.sync
               "sm90 decode G=8 block=16 mma=bf16 values=bf16-offset stages=4",
               "sm90 decode G=8 block=16 mma=fp16 values=fp16-subnormal stages=1",
               "sm90 decode G=8 block=16 mma=fp16 values=fp16-integer stages=4",
               "sm90 decode G=16 block=32 mma=bf16 values=bf16-offset stages=3",
               "sm90 decode G=16 block=32 mma=fp16 values=fp16-subnormal stages=1"} | {
    f"sm90 gdn decode state={s}" for s in ("fp32", "bf16", "fp16")}  # Gluon


def _python(args, cwd=ROOT, extra_path=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), extra_path, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.stdout.strip(), f"no output; stderr:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def results():
    return _python(["-m", "optimized.triton.compile_check", "--json"])


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_kernel_compiles_to_a_code_object(results, target):
    rows = results[target]
    expected = KERNELS | (NVIDIA_ONLY if target.startswith("cuda") else set())
    assert {name.split(" turboquant")[0] for name in rows} == expected
    failed = {name: r.get("error", "not an ELF code object") for name, r in rows.items() if not r["ok"]}
    assert not failed, f"{target}: {failed}"
    assert {r["binary"] for r in rows.values()} == {"cubin" if target.startswith("cuda") else "hsaco"}


def test_a_kernel_with_inline_ptx_fails_the_rocm_compile(tmp_path):
    """The check has teeth: a kernel that converts through an inline PTX instruction compiles for
    sm_90 and not for gfx942."""
    (tmp_path / "planted_ptx.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def ptx_kernel(x_ptr, y_ptr):
            i = tl.arange(0, 128)
            x = tl.load(x_ptr + i)
            y = tl.inline_asm_elementwise("cvt.rn.f16.f32 $0, $1;", "=h,r", [x], dtype=tl.float16,
                                          is_pure=True, pack=1)
            tl.store(y_ptr + i, y)
    '''))
    script = textwrap.dedent('''
        import json
        from optimized.triton.compile_check import compile_one
        from planted_ptx import ptx_kernel
        types = dict(x_ptr="*fp32", y_ptr="*fp16")
        print(json.dumps({t: compile_one(ptx_kernel, types, {}, t) for t in ("cuda:90", "hip:gfx942")}))
    ''')
    res = _python(["-c", script], extra_path=str(tmp_path))
    assert res["cuda:90"]["ok"], res["cuda:90"]
    assert not res["hip:gfx942"]["ok"]
