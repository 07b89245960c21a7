"""``kernel-lab flydsl build --arch gfx950 --out DIR``: compile every FlyDSL variant to ISA."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _out_folder(text: str) -> Path:
    """``--out`` as a folder to write into, made before any work; ValueError naming it otherwise."""
    if not text.strip():
        raise ValueError("--out: empty; expected a folder for the .s files")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {text}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {text}: cannot create ({exc.strerror or exc})") from None
    return out


def _build(args: argparse.Namespace) -> int:
    from optimized.flydsl.build import build, check_arch

    try:
        check_arch(args.arch)
        artifacts = build(args.arch, _out_folder(args.out))
    except (ValueError, RuntimeError) as exc:
        sys.stderr.write(f"kernel-lab flydsl build: error: {exc}\n")
        return 2
    keys = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "lds_bytes", "scratch_bytes")
    print(f"{'variant':<22} {'ok':<4} {'bytes':>8} {'mfma':>5} " + " ".join(f"{k:>16}" for k in keys))
    for a in artifacts:
        cols = " ".join(f"{a.metadata.get(k, '-'):>16}" for k in keys)
        print(f"{a.name:<22} {'yes' if a.ok else 'NO':<4} {a.size_bytes:>8} {a.mfma_count:>5} {cols}")
        if not a.ok:
            print(f"    {a.error}")
    return 0 if all(a.ok for a in artifacts) else 1


def register(subparsers) -> None:
    """Add the ``flydsl`` command (subcommand ``build``) to the kernel-lab CLI."""
    fly = subparsers.add_parser("flydsl", help="FlyDSL kernels for AMD gfx950")
    sub = fly.add_subparsers(dest="flydsl_command", required=True)
    b = sub.add_parser("build", help="compile every kernel variant to ISA (.s), no GPU needed")
    b.add_argument("--arch", default="gfx950", help="AMD target, e.g. gfx950 (gfx942 lacks the MFMA used)")
    b.add_argument("--out", required=True, help="directory for the .s files")
    b.set_defaults(func=_build)
