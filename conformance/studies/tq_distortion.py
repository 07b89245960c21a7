"""`kernel-lab study tq-distortion`: TurboQuant key distortion per bit width on random unit vectors.

For b = 1..4 bits: draw unit vectors x in R^D (D=128), rotate (y = x @ R), snap each coordinate
to the Lloyd-Max centroid (reference.turboquant.lloyd_max, the store's bucketing), and measure
D_mse = E||x - x~||^2 and the inner-product error D_prod = E (<q, x> - <q, x~>)^2 over random
unit queries, plus the shrink factor E<x, x~> (the MSE quantizer's bias), beside the TurboQuant
paper's figures (D_mse 0.36, 0.117, 0.03, 0.009 and the upper bound sqrt(3) pi / 2 * 4^-b).
Also: the same with norm correction (x~ renormalised to unit length, the `_nc` presets).
"""
from __future__ import annotations

import numpy as np

from conformance.studies import bounded_int

NAME = "tq-distortion"
DESCRIPTION = "key MSE distortion and inner-product error per bit width (D=128), vs the TurboQuant paper"
PAPER_MSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}


def add_arguments(parser) -> None:
    parser.add_argument("--dim", type=int, default=128, help="head size D (default 128)")
    parser.add_argument("--vectors", type=int, default=20000, help="random unit vectors (default 20000)")
    parser.add_argument("--rotation", choices=("hadamard", "random"), default="random")
    parser.add_argument("--seed", type=int, default=0)


MAX_VECTORS = 1_000_000


def check(args) -> None:
    """Every argument, before any work: ValueError naming the option."""
    from reference.turboquant.presets import check_head_size

    try:
        check_head_size(args.dim)
    except ValueError as exc:
        raise ValueError(f"--dim {args.dim}: {exc}") from None
    if args.rotation == "hadamard" and args.dim & (args.dim - 1):
        raise ValueError(f"--dim {args.dim}: the Hadamard rotation needs a power of two")
    bounded_int("--vectors", args.vectors, 1, MAX_VECTORS)


def run(args) -> dict:
    from reference.turboquant import lloyd_max, rotation

    D, n = int(args.dim), int(args.vectors)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((n, D))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((n, D))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    R = (rotation.hadamard(D) if args.rotation == "hadamard" else rotation.random_rotation(D, args.seed)).astype(np.float64)
    y = x @ R
    rows = []
    for bits in (1, 2, 3, 4):
        c = lloyd_max.centroids(bits, D).astype(np.float64)
        idx = np.clip(np.searchsorted(lloyd_max.midpoints(c).astype(np.float64), y, side="right"), 0, len(c) - 1)
        row = {"bits": bits, "paper_mse": PAPER_MSE[bits], "paper_upper_bound": float(np.sqrt(3) * np.pi / 2 * 4.0**-bits),
               "gaussian_mse_theory": lloyd_max.gaussian_mse(bits, D)}
        for tag, yq in (("", c[idx]), ("_nc", c[idx] / np.linalg.norm(c[idx], axis=1, keepdims=True))):
            xt = yq @ R.T
            row["mse" + tag] = float(np.mean(np.sum((x - xt) ** 2, axis=1)))
            row["ip_mse" + tag] = float(np.mean((np.sum(q * x, axis=1) - np.sum(q * xt, axis=1)) ** 2))
            row["ip_mse_times_d" + tag] = row["ip_mse" + tag] * D
            row["shrink" + tag] = float(np.mean(np.sum(x * xt, axis=1)))
        rows.append(row)
    return {"study": NAME, "dim": D, "vectors": n, "rotation": args.rotation, "seed": args.seed, "rows": rows}


def summarize(result: dict) -> str:
    lines = [f"TurboQuant key distortion, D={result['dim']}, {result['vectors']} unit vectors, {result['rotation']} rotation",
             f"{'bits':>4} {'D_mse':>8} {'paper':>7} {'bound':>7} {'theory':>7} {'D_mse nc':>9} {'D*ip_err':>9} "
             f"{'D*ip nc':>8} {'shrink':>7}"]
    for r in result["rows"]:
        lines.append(f"{r['bits']:>4} {r['mse']:>8.4f} {r['paper_mse']:>7.3f} {r['paper_upper_bound']:>7.3f} "
                     f"{r['gaussian_mse_theory']:>7.4f} {r['mse_nc']:>9.4f} {r['ip_mse_times_d']:>9.4f} "
                     f"{r['ip_mse_times_d_nc']:>8.4f} {r['shrink']:>7.4f}")
    return "\n".join(lines)
