"""`kernel-lab report`: index.html, junit.xml and summary.md of one or more run folders."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reports import diff, html, junit, load, markdown, perf, studies


@dataclass
class Written:
    index: Path
    junit: Path
    summary: Path
    records: int
    problems: list[str]
    new_failures: int = 0   # against the baseline (0 without one)


def _write(path: Path, text: str) -> Path:
    """Write ``text`` as UTF-8 (a lone surrogate, valid in JSON but not in UTF-8, as a visible
    escape); ValueError names --out when the target is not a regular file or cannot be written."""
    if path.exists() and not path.is_file():
        raise ValueError(f"--out {path.parent}: {path.name} exists and is not a regular file")
    try:
        path.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as exc:
        raise ValueError(f"--out {path.parent}: cannot write {path.name} ({exc.strerror or exc})") from None
    return path


def write(run_dirs: list[str], out: str | None = None, perf_paths: list[str] | None = None,
          baseline: str | None = None, study_paths: list[str] | None = None) -> Written:
    """Read the runs (tolerantly), write the three files into ``out`` (default: the first run
    folder). ValueError names the bad argument (RUN_DIR, --perf, --baseline, --out)."""
    if not run_dirs:
        raise ValueError("RUN_DIR: give at least one run folder")
    runs = [load.load(d) for d in run_dirs]
    perfs = [perf.load(p) for p in perf_paths or []]
    base = None
    if baseline is not None:
        if not Path(baseline).is_dir():
            raise ValueError(f"--baseline {baseline}: not a run folder")
        base = load.load(baseline)
    found = studies.find([r.path for r in runs], study_paths)
    study_items, study_problems = studies.render(found)
    relations = studies.relations(found)
    changes = None
    if base is not None:
        base_perf = Path(baseline) / "perf.json"
        perf_rows = [b for p in perfs for b in p.benchmarks]
        changes = {"records": diff.records_diff([r for run in runs for r in run.records], base.records),
                   "perf": diff.perf_diff(perf_rows, perf.load(base_perf).benchmarks)
                   if perfs and base_perf.exists() else None}
    if out is not None and not out.strip():
        raise ValueError("--out: empty; expected a folder path (leave --out out for the first RUN_DIR)")
    out_dir = Path(out) if out is not None else runs[0].path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out_dir}: cannot create ({exc.strerror or exc})") from None
    index = _write(out_dir / "index.html", html.render(runs, perfs, study_items, study_problems, changes, base,
                                                       relations))
    junit_path = _write(out_dir / "junit.xml", junit.text(runs))
    parts = [markdown.render(r, relations) for r in runs]
    if changes is not None:
        parts.append(markdown.changes(changes["records"], base))
    summary = _write(out_dir / "summary.md", "\n\n".join(parts) + "\n")
    return Written(index, junit_path, summary, sum(len(r.records) for r in runs),
                   [f"{r.name}: {p}" for r in runs for p in r.problems],
                   changes["records"]["new_failures"]["count"] if changes is not None else 0)
