"""Find and draw the numerical studies' JSON (`kernel-lab study gdn-drift|tq-distortion`); the
``relations`` study is read as a column of the coverage table (``relations``).

Without ``--study`` files, the report looks for ``study-*.json`` in each run folder and in the
folder above it (``kernel-lab study`` writes ``reports/out/study-NAME.json``; ``make conform`` runs
go to ``reports/out/conform-*``).
"""
from __future__ import annotations

import json
from pathlib import Path

from reports import figures

STUDIES = {
    "gdn-drift": ("GDN state drift: 16-bit state against float32 state", figures.gdn_drift,
                  "There is no paper figure for this drift. The nearest published figure: 0.18% relative RMS "
                  "trajectory drift over 256 decode steps with a bfloat16 state (kekzl/imp PR #1776, in a model; "
                  "another measure). Float16 overflow is drawn as x at error 1."),
    "tq-distortion": ("TurboQuant key distortion against bit width, beside the paper", figures.tq_distortion,
                      "Paper: TurboQuant's D_mse 0.36, 0.117, 0.03, 0.009 for 1 to 4 bits and the bound "
                      "sqrt(3) pi / 2 * 4^-b."),
}


RELATIONS = "relations"


def relations(paths: list[Path]) -> dict[str, str]:
    """backend -> its relations in words ("batch: bitwise; split: within bound; ..."), from the first
    ``kernel-lab study relations`` JSON among ``paths``; empty without one (an unreadable one is
    ``render``'s problem to report)."""
    for p in paths:
        try:
            result = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and result.get("study") == RELATIONS:
            return {backend: "; ".join(f"{name}: {rel[name]['verdict']}" for name in result["relations"])
                    for backend, rel in result["backends"].items()}
    return {}


def find(run_dirs: list[Path], explicit: list[str] | None) -> list[Path]:
    if explicit:
        return [Path(p) for p in explicit]
    seen: dict[Path, None] = {}
    for d in run_dirs:
        for folder in (d, d.resolve().parent):
            for p in sorted(folder.glob("study-*.json")):
                if p.is_file():  # never open a FIFO or a folder of that name
                    seen.setdefault(p.resolve(), None)
    return list(seen)


def render(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """One entry per study file: name, title, source path, SVG, note, config; plus problems."""
    out, problems = [], []
    for i, p in enumerate(paths):
        try:
            result = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: unreadable study JSON ({exc})")
            continue
        name = result.get("study") if isinstance(result, dict) else None
        if name == RELATIONS:    # a column of the coverage table (``relations``), not a figure
            continue
        if name not in STUDIES:
            problems.append(f"{p}: not a known study (study = {name!r}; known: {', '.join(STUDIES)})")
            continue
        if any(o["name"] == name for o in out):
            problems.append(f"{p}: another {name} study was found first; this one is not shown")
            continue
        title, draw, note = STUDIES[name]
        try:
            svg = draw(result, salt=f"study{i}")
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"{p}: {name} JSON lacks what the figure needs ({type(exc).__name__}: {exc})")
            continue
        config = result.get("config") or {k: result[k] for k in ("dim", "vectors", "rotation", "seed") if k in result}
        out.append({"name": name, "title": title, "path": str(p), "svg": svg, "note": note,
                    "config": config, "overflow": result.get("overflow_probe")})
    return out, problems
