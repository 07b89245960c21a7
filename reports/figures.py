"""Inline SVG figures (matplotlib's SVG backend, no pyplot state): roofline, GDN drift,
TurboQuant distortion. Text stays text (svg.fonttype none) and each figure gets its own id salt,
so several figures can share one HTML page without clashing clip-path ids.
"""
from __future__ import annotations

import io
import math

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

ROLE_STYLE = {"ours": ("#1f6feb", "o"), "peer": ("#d1242f", "s"), "baseline": ("#8250df", "^"),
              "ceiling": ("#6e7781", "D")}
DTYPE_COLOR = {"float32": "#1f6feb", "bfloat16": "#bc4c00", "float16": "#8250df"}


def _svg(fig: Figure, salt: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def roofline(benchmarks: list[dict], ceilings: dict[str, dict], salt: str) -> str | None:
    """Arithmetic intensity (FLOP/byte) against achieved TFLOP/s; bandwidth ceilings as sloped
    lines (TFLOP/s = GB/s x intensity / 1000), compute ceilings as flat ones. Benchmarks without
    FLOPs or bytes cannot be placed and are left out (the table lists them). None if none can."""
    pts = [b for b in benchmarks if b.get("flops") and b.get("bytes") and b.get("tflops")]
    if not pts:
        return None
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    ai = [b["flops"] / b["bytes"] for b in pts]
    lo, hi = min(ai) / 4, max(ai) * 4
    xs = [lo * (hi / lo) ** (i / 50) for i in range(51)]
    peaks = [c["tflops"] for c in ceilings.values() if "tflops" in c]
    ys = [b["tflops"] for b in pts]
    top = max(ys + peaks) * 3
    for name, c in ceilings.items():
        if "gbps" in c:
            line = [c["gbps"] * x / 1000 for x in xs]
            ax.plot(xs, line, "--", lw=1, color="#57606a")
            at = max((i for i, y in enumerate(line) if y <= top / 3), default=0)
            ax.annotate(f"{name} {c['gbps']:.3g} GB/s", (xs[at], line[at]), fontsize=7,
                        color="#57606a", ha="right", va="bottom")
        if "tflops" in c:
            ax.axhline(c["tflops"], ls=":", lw=1, color="#57606a")
            ax.annotate(f"{name} {c['tflops']:.3g} TFLOP/s", (xs[-12], c["tflops"]), fontsize=7,
                        color="#57606a", va="bottom")
    for role in ROLE_STYLE:
        sel = [(x, b) for x, b in zip(ai, pts) if b.get("role") == role]
        if sel:
            color, marker = ROLE_STYLE[role]
            ax.scatter([x for x, _ in sel], [b["tflops"] for _, b in sel], c=color, marker=marker, label=role, zorder=3)
            for x, b in sel:
                ax.annotate(f"{b['bench']} {b['impl']}", (x, b["tflops"]), fontsize=6.5,
                            xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(min(ys) / 4, top)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", lw=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig, salt)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def gdn_drift(result: dict, salt: str) -> str:
    """Two panels: relative L2 error against tokens (length sweep) and against split-and-resume
    round trips, per state dtype; overflowed points (None) are marked on the axis, not dropped."""
    fig = Figure(figsize=(8, 3.4))
    a1, a2 = fig.subplots(1, 2)
    for dtype, color in DTYPE_COLOR.items():
        sweep = [r for r in result.get("length_sweep", []) if r["state_dtype"] == dtype]
        for key, ls in (("o_rel_l2", "-"), ("state_rel_l2", "--")):
            pts = [(r["tokens"], r[key]) for r in sweep if _finite(r.get(key))]
            if pts:
                a1.plot(*zip(*pts), ls, marker="o", ms=3, color=color,
                        label=f"{dtype} {'output' if key == 'o_rel_l2' else 'state'}")
        bad = [r["tokens"] for r in sweep if r.get("o_rel_l2") is None]
        if bad:
            a1.plot(bad, [1] * len(bad), "x", color=color, ms=8, label=f"{dtype} overflow")
        trips = [r for r in result.get("round_trips", []) if r["state_dtype"] == dtype]
        pts = [(r["round_trips"] + 1, r["o_rel_l2"]) for r in trips if _finite(r.get("o_rel_l2"))]
        if pts:
            a2.plot(*zip(*pts), "-", marker="o", ms=3, color=color, label=f"{dtype} output")
    a1.set(xscale="log", yscale="log", xlabel="tokens", ylabel="rel. L2 error vs float32 state",
           title="error against sequence length")
    a2.set(xscale="log", yscale="log", xlabel="prefill calls (round trips + 1)",
           title="error against prefix-cache round trips")
    for a in (a1, a2):
        a.xaxis.set_minor_formatter(NullFormatter())
        a.grid(True, lw=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    return _svg(fig, salt)


def tq_distortion(result: dict, salt: str) -> str:
    """Key MSE distortion against bit width: measured (plain and norm-corrected), the paper's
    figures and its upper bound, the Gaussian Lloyd-Max theory."""
    rows = result.get("rows", [])
    bits = [r["bits"] for r in rows]
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.add_subplot()
    series = (("mse", "measured D_mse", "o-", "#1f6feb"), ("mse_nc", "measured, norm-corrected", "s-", "#0a7f3f"),
              ("paper_mse", "paper (TurboQuant)", "D", "#d1242f"),
              ("paper_upper_bound", "paper bound sqrt(3)pi/2 4^-b", "--", "#d1242f"),
              ("gaussian_mse_theory", "Gaussian Lloyd-Max theory", ":", "#57606a"))
    for key, label, style, color in series:
        pts = [(b, r[key]) for b, r in zip(bits, rows) if _finite(r.get(key))]
        if pts:
            ax.plot(*zip(*pts), style, color=color, label=label, ms=5, lw=1.2)
    ax.set(yscale="log", xlabel="bits per coordinate", ylabel="E ||x - x~||^2 (unit x)", xticks=bits)
    ax.grid(True, lw=0.3)
    ax.legend(fontsize=7)
    return _svg(fig, salt)
