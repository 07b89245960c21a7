"""Compile every FlyDSL kernel variant to AMD ISA (``.s``) on any machine, GPU or not.

FlyDSL's compile-only mode (``COMPILE_ONLY=1 ARCH=<arch>``) runs the whole MLIR/LLVM pipeline
and, with ``FLYDSL_DUMP_IR=1``, writes the final ISA; the last step (``gpu-module-to-binary``)
calls ``$ROCM_PATH/llvm/bin/ld.lld``. The Makefile target ``flydsl-toolchain`` makes ``.rocm/``
with Debian's lld-19 there. Each variant compiles in its own process: LLVM aborts the process on
an instruction the target lacks (gfx942 has no ``v_mfma_f32_16x16x32_bf16``), and the dump
directory is per process.

``build(arch, out_dir)`` returns one ``Artifact`` per variant with the ISA metadata (VGPR, SGPR,
AGPR, spill counts, LDS bytes, scratch bytes) read from the ``.s`` file's ``amdhsa.kernels`` note.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROCM_DIR = REPO / ".rocm"
MFMA = "v_mfma_f32_16x16x32_bf16"
# (G, block_size) of each variant; Hk, M and the scale are fixed representative values.
VARIANTS = [(g, bs) for g in (6, 8, 16) for bs in (16, 32)]
SAMPLE = {"Hk": 4, "max_blocks": 16, "batch": 2}
METADATA_KEYS = {
    "vgpr_count": ".vgpr_count", "agpr_count": ".agpr_count", "sgpr_count": ".sgpr_count",
    "vgpr_spill_count": ".vgpr_spill_count", "sgpr_spill_count": ".sgpr_spill_count",
    "lds_bytes": ".group_segment_fixed_size", "scratch_bytes": ".private_segment_fixed_size",
}


@dataclass
class Artifact:
    name: str
    ok: bool
    path: Path | None = None
    size_bytes: int = 0
    mfma_count: int = 0
    metadata: dict[str, int] = field(default_factory=dict)
    error: str = ""


def variant_name(G: int, block_size: int) -> str:
    return f"tq_decode_g{G}_bs{block_size}"


def toolchain_problem() -> str | None:
    """Why the ISA cannot be built here, or None."""
    try:
        import flydsl  # noqa: F401
    except ImportError as exc:
        return f"FlyDSL is not importable ({exc}); `make flydsl-toolchain` installs the pinned wheel"
    if not (ROCM_DIR / "llvm" / "bin" / "ld.lld").exists():
        return f"{ROCM_DIR}/llvm/bin/ld.lld is missing; run `make flydsl-toolchain`"
    return None


def read_metadata(isa_text: str) -> dict[str, int]:
    """Register, LDS and scratch use from the ISA's ``amdhsa.kernels`` metadata."""
    out = {}
    for key, field_name in METADATA_KEYS.items():
        m = re.search(rf"^\s*-?\s*{re.escape(field_name)}:\s+(\d+)", isa_text, re.M)
        if m:
            out[key] = int(m.group(1))
    return out


def compile_one(G: int, block_size: int, arch: str, out_dir: Path, timeout_s: float = 600) -> Artifact:
    """Compile one variant in a child process and copy its ISA to ``out_dir/<name>.s``."""
    name = variant_name(G, block_size)
    with tempfile.TemporaryDirectory(prefix="flydsl-dump-") as dump:
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, ROCM_PATH=str(ROCM_DIR),
                   FLYDSL_DUMP_IR="1", FLYDSL_DUMP_DIR=dump, FLYDSL_RUNTIME_ENABLE_CACHE="0",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-m", "optimized.flydsl.build", "--child", str(G), str(block_size)]
        try:
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Artifact(name, False, error=f"compile timed out after {timeout_s:.0f} s")
        isa = sorted(Path(dump).glob("*/*_final_isa.s"))
        if proc.returncode != 0 or not isa:
            lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "error" in ln.lower()] or lines[-4:]
            return Artifact(name, False, error=" | ".join(errors[:4]) or f"exit code {proc.returncode}")
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / f"{name}.s"
        shutil.copyfile(isa[-1], dest)
    text = dest.read_text()
    return Artifact(name, True, dest, dest.stat().st_size, text.count(MFMA), read_metadata(text))


TARGETS = ("gfx950",)  # the MFMA 16x16x32 bf16 the kernel uses is CDNA4's


def check_arch(arch: str) -> str:
    """``arch`` if the kernels can target it; ValueError naming ``--arch`` otherwise."""
    if arch not in TARGETS:
        raise ValueError(f"--arch {arch!r}: the kernels use v_mfma_f32_16x16x32_bf16 (CDNA4); "
                         f"expected one of {', '.join(TARGETS)}")
    return arch


def build(arch: str, out_dir: Path) -> list[Artifact]:
    """Compile every variant for ``arch`` (one of ``TARGETS``: ValueError otherwise); raises
    RuntimeError when the toolchain is missing."""
    check_arch(arch)
    problem = toolchain_problem()
    if problem:
        raise RuntimeError(problem)
    return [compile_one(G, bs, arch, Path(out_dir)) for G, bs in VARIANTS]


def _child(G: int, block_size: int) -> None:
    """Trace and compile one variant with CPU tensors (the environment selects compile-only)."""
    import torch

    from optimized.flydsl import plan
    from optimized.flydsl.tq_decode_kernel import HEAD_DIM, SLOT_BYTES, build_tq_decode

    Hk, M, B = SAMPLE["Hk"], SAMPLE["max_blocks"], SAMPLE["batch"]
    P = plan.num_parts(M, block_size)
    fn = build_tq_decode(G=G, block_size=block_size, Hk=Hk, max_blocks=M, num_parts=P,
                         tiles_per_part=plan.TILES_PER_PART, scale=HEAD_DIM ** -0.5)
    fn(torch.zeros(B, Hk * G, HEAD_DIM, dtype=torch.bfloat16),
       torch.zeros(B * M * block_size * Hk * SLOT_BYTES, dtype=torch.uint8),
       torch.zeros(B, M, dtype=torch.int32), torch.ones(B, dtype=torch.int32), torch.zeros(16),
       torch.zeros(B, Hk, P, 16, HEAD_DIM), torch.zeros(B, Hk, P, 16), torch.zeros(B, Hk, P, 16), B)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    _child(int(sys.argv[2]), int(sys.argv[3]))
