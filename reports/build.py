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


def _noise(rows: list[dict]) -> tuple[dict | None, str]:
    """The A/A noise of the card the perf rows were measured on (``bench.baselines``: noise.json
    of their fingerprint key) and where it was looked for; None when there is none."""
    from bench import baselines

    keys = sorted({(r.get("fingerprint") or {}).get("key") for r in rows} - {None})
    if len(keys) != 1:
        return None, f"unknown ({'no' if not keys else 'several'} machine keys in the perf rows)"
    path = baselines.folder(keys[0]) / "noise.json"
    return (baselines.noise(keys[0]), str(path)) if path.exists() else (None, f"unknown (no {path})")


def _gpus(items: list[dict]) -> set[str]:
    """GPU names of run.json ``gpus`` entries or of perf rows (their fingerprint's ``gpu``)."""
    return {(x.get("fingerprint", {}).get("gpu") or {}).get("name") if "fingerprint" in x else x.get("name")
            for x in items} - {None}


def across_cards(runs: list[load.Run], perfs: list[perf.Perf], base: load.Run | None,
                 base_rows: list[dict] | None) -> dict | None:
    """Two cards side by side, when the two runs compared carry different hardware fingerprints
    (``diff.hardware``): the baseline (card a) against the runs, or, without a baseline, the first
    of two runs against the second (and the first --perf against the second). None otherwise."""
    if base is not None:
        a, b, rows_a, rows_b = base, runs, base_rows, [x for p in perfs for x in p.benchmarks] or None
    elif len(runs) == 2:
        a, b = runs[0], runs[1:]
        rows_a, rows_b = (perfs[0].benchmarks, perfs[1].benchmarks) if len(perfs) == 2 else (None, None)
        if rows_a is not None and _gpus(rows_a) == _gpus(runs[1].info.get("gpus") or []) \
                and _gpus(rows_b) == _gpus(runs[0].info.get("gpus") or []) != _gpus(rows_a):
            rows_a, rows_b = rows_b, rows_a   # the perf JSON given in the other order than the runs
    else:
        return None
    card_a, card_b = diff.hardware(a.info), diff.hardware(b[0].info)
    if not card_a or not card_b or card_a == card_b:
        return None
    out = {"card_a": card_a, "card_b": card_b, "run_a": str(a.path), "run_b": ", ".join(str(r.path) for r in b),
           "records": diff.cross_card(a.records, [r for run in b for r in run.records]), "perf": None}
    if rows_a is not None and rows_b is not None:
        (noise_a, where_a), (noise_b, where_b) = _noise(rows_a), _noise(rows_b)
        out.update(perf=diff.fraction_moves(rows_a, rows_b, noise_a, noise_b), noise_a=where_a, noise_b=where_b)
    return out


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
    base_rows = None
    if base is not None:
        base_perf = Path(baseline) / "perf.json"
        base_rows = perf.load(base_perf).benchmarks if base_perf.exists() else None
        perf_rows = [b for p in perfs for b in p.benchmarks]
        changes = {"records": diff.records_diff([r for run in runs for r in run.records], base.records),
                   "perf": diff.perf_diff(perf_rows, base_rows) if perfs and base_rows is not None else None}
    cards = across_cards(runs, perfs, base, base_rows)
    if out is not None and not out.strip():
        raise ValueError("--out: empty; expected a folder path (leave --out out for the first RUN_DIR)")
    out_dir = Path(out) if out is not None else runs[0].path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out_dir}: cannot create ({exc.strerror or exc})") from None
    index = _write(out_dir / "index.html", html.render(runs, perfs, study_items, study_problems, changes, base,
                                                       cards, relations))
    junit_path = _write(out_dir / "junit.xml", junit.text(runs))
    parts = [markdown.render(r, relations) for r in runs]
    if changes is not None:
        parts.append(markdown.changes(changes["records"], base))
    if cards is not None:
        parts.append(markdown.across_cards(cards))
    summary = _write(out_dir / "summary.md", "\n\n".join(parts) + "\n")
    return Written(index, junit_path, summary, sum(len(r.records) for r in runs),
                   [f"{r.name}: {p}" for r in runs for p in r.problems],
                   changes["records"]["new_failures"]["count"] if changes is not None else 0)
