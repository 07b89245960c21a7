"""`merge`: the run folders of the shards K/N of one selection joined into one folder, after the
checks that make the result exactly one unsharded run's records: every input a finished run of the
same selection, every shard of one N once, no (cell, backend) pair twice."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from conformance import fingerprint
from conformance.errors import RunStopped, UsageError, shown
from conformance.run import records, schema
from conformance.run.counts import count
from conformance.run.run_folder import check_out, make_out
from conformance.run.selection import SELECTION_KEYS, Selection, parse_shard, selection_differences


def shard_runs(inputs: list[str]) -> list[tuple[str, dict, list[dict]]]:
    """Each input's run.json and records, checked: finished runs of one tier and selection, shards
    K/N for every K of one N, no pair twice. Usage errors name the input."""
    runs = []
    for src in inputs:
        folder = Path(src)
        if not folder.is_dir():
            raise UsageError(f"merge: {src} is not a run folder")
        runs.append((src, records.read_json(folder / "run.json"), records.read(folder / "cells.jsonl")))
    selections = []
    for src, info, _ in runs:
        sel = info.get("selection")
        if not isinstance(sel, dict):
            raise UsageError(f"merge: {src}/run.json records no selection (an older kernel-lab wrote it)")
        if "finished" not in info or "stopped" in info:
            raise UsageError(f"merge: the run in {src} did not finish; complete it with `conform --resume`")
        selections.append(sel)
    keys = [k for k in SELECTION_KEYS if k != "shard"]
    for (src, _, _), sel in zip(runs[1:], selections[1:]):
        diff = selection_differences(selections[0], sel, keys)
        if diff:
            raise UsageError(f"merge: {src} is another selection than {runs[0][0]}: {'; '.join(diff)}")
    shards = [parse_shard(sel.get("shard")) for sel in selections]
    if None in shards:
        src = runs[shards.index(None)][0]
        raise UsageError(f"merge: {src} is not a shard (run with --shard K/N); merge joins the shards of one run")
    ns = {n for _, n in shards}
    if len(ns) != 1:
        raise UsageError(f"merge: the inputs split the run differently (N = {', '.join(map(str, sorted(ns)))})")
    (n,) = ns
    got = Counter(k for k, _ in shards)
    twice = [f"{k}/{n}" for k, c in got.items() if c > 1]
    missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in got]
    if twice:
        raise UsageError(f"merge: shard {', '.join(twice)} given more than once")
    if missing:
        raise UsageError(f"merge: shard {', '.join(missing)} missing")
    seen: dict[tuple, str] = {}
    for src, _, recs in runs:
        for r in recs:
            k = records.key(r)
            if k in seen:
                raise UsageError(f"merge: {shown(r['id'])} on {shown(r['backend'])} is in both {seen[k]} and {src}")
            seen[k] = src
    for src, info, recs in runs:
        _agrees_with_run_json(src, info, recs)
    return runs



def _agrees_with_run_json(src: str, info: dict, recs: list[dict]) -> None:
    """A shard's records must be what its run.json says it ran: the counts it recorded, and only
    pairs of its selection (cells of its tier, filter and shard; its backends)."""
    recorded = {b: {s: n for s, n in c.items() if n} for b, c in (info.get("counts") or {}).items()}
    found = {b: dict(c) for b, c in count(recs).items()}
    if recorded != found:
        raise UsageError(f"merge: {src}/cells.jsonl does not hold what its run.json counts "
                         f"(run.json {recorded}, cells.jsonl {found}); the shard was edited or mixed")
    sel = info["selection"]
    try:
        cells, backends = Selection(**{k: sel.get(k) for k in SELECTION_KEYS}
                                    | {"backends": tuple(sel["backends"]) if sel.get("backends") else None}).resolve()
    except UsageError as exc:
        raise UsageError(f"merge: {src}/run.json holds a selection this kernel-lab cannot resolve: {exc}") from None
    ids, names = {c.id for c in cells}, {b.name for b in backends}
    for n, r in enumerate(recs, 1):
        if r["id"] not in ids or r["backend"] not in names:
            raise UsageError(f"merge: {src}/cells.jsonl:{n}: {shown(r['id'])} on {shown(r['backend'])} is outside the "
                             f"shard's selection ({sel.get('tier')} tier, shard {sel.get('shard')})")


@dataclass
class Merged:
    out_dir: Path
    counts: dict[str, Counter]
    records: int


def merge(inputs: list[str], out: str | Path) -> Merged:
    """Write the records and a run.json of the shard folders ``inputs`` (checked by ``shard_runs``)
    into the new folder ``out``; on a write error nothing is left there (``RunStopped``)."""
    check_out(out)
    runs = shard_runs(inputs)
    out_dir = Path(out)
    if (out_dir / "cells.jsonl").exists():
        raise UsageError(f"--out {out_dir}: already holds cells.jsonl; choose another --out")
    created = not out_dir.exists()
    out_dir = make_out(out_dir)
    merged = [r for _, _, recs in runs for r in recs]
    counts = count(merged)
    # one unsharded run: no shard, no split, no scheduler variables
    selection = {k: v for k, v in runs[0][1]["selection"].items() if k not in ("shard_by", "shard_from")}
    selection["shard"] = None
    try:
        records.write_all(out_dir / "cells.jsonl", merged)
        # the oldest shard's version: its records lack what later versions added
        version = min(schema.version(info) for _, info, _ in runs)
        records.dump_json(out_dir / "run.json", {"schema": version, **fingerprint.fingerprint(), "selection": selection,
                                                 "merged_from": {src: info for src, info, _ in runs},
                                                 "counts": {k: dict(v) for k, v in counts.items()},
                                                 "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    except OSError as exc:
        for name in ("cells.jsonl", "run.json"):
            (out_dir / name).unlink(missing_ok=True)
        if created:
            out_dir.rmdir()
        raise RunStopped(f"merge: cannot write into {out_dir} ({exc.strerror or exc}); "
                         "nothing was left there") from None
    return Merged(out_dir, counts, len(merged))
