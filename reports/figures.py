"""Inline SVG figures (matplotlib's SVG backend, no pyplot state): roofline, GDN drift,
TurboQuant distortion. Text stays text (svg.fonttype none) and each figure gets its own id salt,
so several figures can share one HTML page without clashing clip-path ids.
"""
from __future__ import annotations

import io
import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

ROLE_STYLE = {"ours": ("#1f6feb", "o"), "peer": ("#d1242f", "s"), "baseline": ("#8250df", "^"),
              "ceiling": ("#6e7781", "D")}
DTYPE_COLOR = {"float32": "#1f6feb", "bfloat16": "#bc4c00", "float16": "#8250df"}


def _svg(fig: Figure, salt: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


CEILING_COLORS = ("#57606a", "#bc4c00", "#0a7f3f", "#8250df", "#953800", "#1b7c83")


def shape_label(b: dict) -> str:
    """The shape part of a benchmark's name ``bench/shape/impl`` (e.g. ``L=8192,act=float16``)."""
    name, bench, impl = b.get("name", ""), b.get("bench", ""), b.get("impl", "")
    if name.startswith(bench + "/") and name.endswith("/" + impl):
        return name[len(bench) + 1:len(name) - len(impl) - 1]
    return ""


def _spread(ys: list[float], gap: float) -> list[float]:
    """Positions in [0, 1] as close to ``ys`` as they can be with at least ``gap`` between
    neighbours (labels that do not overprint); order kept."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1] + gap) if out else y)
    over = out[-1] - 1.0 if out else 0.0
    if over > 0:  # pushed past the top: move everything down, keeping the gaps
        out = [y - over for y in out]
        for i in range(len(out) - 2, -1, -1):
            out[i] = min(out[i], out[i + 1] - gap)
    return out


def roofline(benchmarks: list[dict], ceilings: dict[str, dict], salt: str) -> str | None:
    """Arithmetic intensity (FLOP/byte) against achieved TFLOP/s; bandwidth ceilings as sloped
    lines (TFLOP/s = GB/s x intensity / 1000), compute ceilings as flat ones, each named in the
    legend. Every point is labelled with its implementation and shape in a column right of the
    axes, spread so that no two labels overprint, with a line to its point. Benchmarks without
    FLOPs or bytes cannot be placed and are left out (the table lists them). None if none can."""
    pts = [b for b in benchmarks if b.get("flops") and b.get("bytes") and b.get("tflops")]
    if not pts:
        return None
    ai = [b["flops"] / b["bytes"] for b in pts]
    lo, hi = min(ai) / 4, max(ai) * 4
    xs = [lo * (hi / lo) ** (i / 50) for i in range(51)]
    peaks = [c["tflops"] for c in ceilings.values() if "tflops" in c]
    ys = [b["tflops"] for b in pts]
    bottom, top = min(ys) / 4, max(ys + peaks) * 3
    gap_in = 0.13  # inches between label baselines (6.5 pt text)
    height = max(4.2, gap_in * (len(pts) + 2))
    fig = Figure(figsize=(10, height))
    ax = fig.add_axes((0.08, 0.1, 0.52, 0.85))
    for i, (name, c) in enumerate(ceilings.items()):
        color = CEILING_COLORS[i % len(CEILING_COLORS)]
        if "gbps" in c:
            ax.plot(xs, [c["gbps"] * x / 1000 for x in xs], "--", lw=1, color=color, label=f"{name} {c['gbps']:,.0f} GB/s")
        if "tflops" in c:
            ax.axhline(c["tflops"], ls=":", lw=1.2, color=color, label=f"{name} {c['tflops']:.3g} TFLOP/s")
    for role in ROLE_STYLE:
        sel = [(x, b) for x, b in zip(ai, pts) if b.get("role") == role]
        if sel:
            color, marker = ROLE_STYLE[role]
            ax.scatter([x for x, _ in sel], [b["tflops"] for _, b in sel], c=color, marker=marker, label=role, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom, top)
    frac = lambda y: math.log(y / bottom) / math.log(top / bottom)  # noqa: E731
    order = sorted(range(len(pts)), key=lambda i: (pts[i]["tflops"], ai[i]))
    axes_in = 0.85 * height
    placed = _spread([frac(pts[i]["tflops"]) for i in order], gap_in / axes_in)
    for i, y in zip(order, placed):
        b = pts[i]
        ax.annotate(f"{b['bench']} {b['impl']} {shape_label(b)}".strip(), (ai[i], b["tflops"]),
                    xytext=(1.03, y), textcoords="axes fraction", fontsize=6.5, va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "color": ROLE_STYLE.get(b.get("role"), ("#57606a",))[0]})
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", lw=0.3)
    ax.legend(loc="upper left", fontsize=7)
    return _svg(fig, salt)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def gdn_drift(result: dict, salt: str) -> str:
    """One panel per measurement the result holds: relative L2 error against tokens (length sweep),
    against split-and-resume round trips, and against decode calls (decode chains), per state dtype;
    overflowed points (None) are marked on the axis, not dropped. A ``--decode-only`` result draws
    its one panel."""
    sweep_rows, trip_rows = result.get("length_sweep", []), result.get("round_trips", [])
    chains = result.get("decode_chain", [])
    kinds = [k for k, rows in (("sweep", sweep_rows), ("trips", trip_rows), ("chains", chains)) if rows]
    fig = Figure(figsize=(4 * max(2, len(kinds)), 3.4))
    axes = dict(zip(kinds, np.atleast_1d(fig.subplots(1, max(1, len(kinds))))))
    panels = []
    if "sweep" in axes:
        a1 = axes["sweep"]
        for dtype, color in DTYPE_COLOR.items():
            sweep = [r for r in sweep_rows if r["state_dtype"] == dtype]
            for key, ls in (("o_rel_l2", "-"), ("state_rel_l2", "--")):
                pts = [(r["tokens"], r[key]) for r in sweep if _finite(r.get(key))]
                if pts:
                    a1.plot(*zip(*pts), ls, marker="o", ms=3, color=color,
                            label=f"{dtype} {'output' if key == 'o_rel_l2' else 'state'}")
            bad = [r["tokens"] for r in sweep if r.get("o_rel_l2") is None]
            if bad:
                a1.plot(bad, [1] * len(bad), "x", color=color, ms=8, label=f"{dtype} overflow")
        a1.set(xscale="log", yscale="log", xlabel="tokens", ylabel="rel. L2 error vs float32 state",
               title="error against sequence length")
        panels.append((a1, sorted({r["tokens"] for r in sweep_rows})))
    if "trips" in axes:
        a2 = axes["trips"]
        for dtype, color in DTYPE_COLOR.items():
            trips = [r for r in trip_rows if r["state_dtype"] == dtype]
            pts = [(r["round_trips"] + 1, r["o_rel_l2"]) for r in trips if _finite(r.get("o_rel_l2"))]
            if pts:
                a2.plot(*zip(*pts), "-", marker="o", ms=3, color=color, label=f"{dtype} output")
        a2.set(xscale="log", yscale="log", xlabel="prefill calls (round trips + 1)",
               title="error against prefix-cache round trips")
        panels.append((a2, sorted({r["round_trips"] + 1 for r in trip_rows})))
    if "chains" in axes:
        a3 = axes["chains"]
        for dtype, color in DTYPE_COLOR.items():
            for key, ls in (("o_rel_l2", "-"), ("state_rel_l2", "--")):
                pts = [(r["steps"], r[key]) for r in chains if r["state_dtype"] == dtype and _finite(r.get(key))]
                if pts:
                    a3.plot(*zip(*pts), ls, marker="o", ms=3, color=color,
                            label=f"{dtype} {'output' if key == 'o_rel_l2' else 'state'}")
        a3.set(xscale="log", yscale="log", xlabel="decode calls", title="error against decode calls",
               **({} if panels else {"ylabel": "rel. L2 error vs float32 state"}))
        panels.append((a3, sorted({r["steps"] for r in chains})))
    for a, ticks in panels:
        if ticks:  # every measured x labelled, in plain numbers
            a.set_xticks(ticks, [f"{t:g}" for t in ticks], rotation=45, fontsize=7)
        a.xaxis.set_minor_formatter(NullFormatter())
        # labels at 1, 2 and 5 of each decade, so values between powers of ten can be read
        a.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=30))
        a.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0e}".replace("e-0", "e-").replace("e+0", "e")))
        a.yaxis.set_minor_formatter(NullFormatter())
        a.tick_params(axis="y", labelsize=7)
        a.grid(True, lw=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, handlelength=3.5)
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
