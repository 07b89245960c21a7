"""`kernel-lab` (also `python -m conformance`): doctor, conform, merge, list-cells, report, study,
plus commands registered by other packages (`plan-blocks`, `flydsl`).

Bad requests print one line saying what is wrong and exit with status 2; a conform run exits
with 1 when any cell fails, errors or crashes.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

from conformance import families, fingerprint, records, registry, runner
from conformance.runner import UsageError

PLUGIN_MODULES = ("planner.cli", "optimized.flydsl.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def cmd_doctor(args) -> int:
    fp = fingerprint.fingerprint()
    cpu = fp["cpu"]
    print(f"CPU      {cpu['model']}, {cpu['cores']} cores ({cpu.get('usable_cores')} usable), "
          f"{cpu.get('memory_gib')} GiB")
    print(f"flags    {' '.join(cpu['flags']) or '(none of interest)'}")
    for g in fp["gpus"]:
        arch = g.get("compute_capability") or g.get("arch") or ""
        print(f"GPU      {g['name']} {arch} {g.get('runtime', '')} driver {g.get('driver', '?')}")
    if not fp["gpus"]:
        print("GPU      none visible to torch")
    print("versions " + ", ".join(f"{k} {v}" for k, v in fp["versions"].items() if v))
    print(f"commit   {fp['git']['commit']}{' (dirty)' if fp['git']['dirty'] else ''}")
    print("backends")
    for name, b in registry.backends().items():
        ok, why = registry.probe(b)
        fams = ", ".join(f"{f}: {' '.join(ops)}" for f, ops in b.ops.items())
        print(f"  {'yes' if ok else 'no ':3} {name:24} {why}")
        print(f"      {fams}")
    return 0


def cmd_list_cells(args) -> int:
    tiers = [args.tier] if args.tier else list(families.TIERS)
    for tier in tiers:
        cells = runner.select_cells(tier, args.family, args.op, args.filter)
        if args.ids:
            for c in cells:
                print(c.id)
            continue
        per = Counter((c.family, c.op) for c in cells)
        print(f"{tier}: {len(cells)} cells")
        for (fam, op), n in sorted(per.items()):
            print(f"  {fam}/{op}: {n}")
    return 0


def cmd_conform(args) -> int:
    shard = runner.parse_shard(args.shard)
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: expected a positive number of worker processes")
    backends = runner.select_backends(_split(args.backend))
    cells = runner.select_cells(args.tier, args.family, args.op, args.filter, shard)
    meta = {"tier": args.tier, "family": args.family, "op": args.op, "filter": args.filter,
            "shard": args.shard, "jobs": args.jobs, "backends_requested": _split(args.backend)}
    runner.prepare_out(args.out, args.resume)  # bad --out or records: exit 2 before any work
    print(f"{len(cells)} cells x {len(backends)} backends -> {args.out}", file=sys.stderr)
    result = runner.run(cells, backends, args.out, jobs=args.jobs, resume=args.resume, meta=meta)
    print(runner.summary_table(result.counts))
    print(f"records: {result.out_dir / 'cells.jsonl'}  run: {result.out_dir / 'run.json'}  "
          f"({result.elapsed_s:.1f} s)")
    return result.exit_status


def cmd_merge(args) -> int:
    out_dir, _ = runner.prepare_out(args.out, resume=False)
    seen: dict[tuple, str] = {}
    merged, runs = [], []
    for src in args.inputs:
        path = Path(src) / "cells.jsonl"
        if not path.exists():
            raise UsageError(f"{src}: no cells.jsonl")
        try:
            recs = records.read(path)
        except records.RecordsError as exc:
            raise UsageError(str(exc)) from None
        for r in recs:
            k = records.key(r)
            if k in seen:
                raise UsageError(f"{r['id']} on {r['backend']} is in both {seen[k]} and {src}")
            seen[k] = src
            merged.append(r)
        run_json = Path(src) / "run.json"
        runs.append(json.loads(run_json.read_text()) if run_json.exists() else {"missing": str(run_json)})
    records.write_all(out_dir / "cells.jsonl", merged)
    counts: dict[str, Counter] = {}
    for r in merged:
        counts.setdefault(r["backend"], Counter())[r["status"]] += 1
    records.dump_json(out_dir / "run.json", {**fingerprint.fingerprint(), "merged_from": runs,
                                             "counts": {k: dict(v) for k, v in counts.items()}})
    print(runner.summary_table(counts))
    print(f"merged {len(merged)} records from {len(args.inputs)} runs into {out_dir}")
    return 0


def cmd_report(args) -> int:
    from reports import markdown

    run_dir = Path(args.run_dir)
    if not (run_dir / "cells.jsonl").exists():
        raise UsageError(f"{run_dir}: no cells.jsonl (run `kernel-lab conform --out {run_dir}` first)")
    try:
        text = markdown.render(run_dir)
    except records.RecordsError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out) if args.out else run_dir / "report.md"
    out.write_text(text + "\n")
    print(f"report: {out}")
    return 0


def cmd_study(args) -> int:
    study = args.study_module
    result = study.run(args)
    out = Path(args.out) if args.out else Path("reports/out") / f"study-{study.NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    records.dump_json(out, result)
    print(study.summarize(result))
    print(f"json: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kernel-lab", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    d = sub.add_parser("doctor", help="fingerprint of this machine and every backend: available or why not")
    d.set_defaults(func=cmd_doctor)

    c = sub.add_parser("conform", help="run the conformance matrix")
    c.add_argument("--family", help="gdn or turboquant (default: all)")
    c.add_argument("--op", help="one op of the family (default: all)")
    c.add_argument("--backend", action="append", help="backend name(s), comma-separated or repeated (default: all)")
    c.add_argument("--tier", default="ci", help="smoke, ci or full (default ci)")
    c.add_argument("--filter", help="regular expression searched in cell ids")
    c.add_argument("--out", default="reports/out/conform", help="run directory (cells.jsonl, run.json)")
    c.add_argument("--resume", action="store_true", help="skip (cell, backend) pairs already in cells.jsonl")
    c.add_argument("--shard", help="K/N: run the K-th of N interleaved parts of the matrix")
    c.add_argument("--jobs", type=int, default=1, help="worker processes in parallel (default 1)")
    c.set_defaults(func=cmd_conform)

    m = sub.add_parser("merge", help="join the run directories of shards into one")
    m.add_argument("--out", required=True, help="new run directory")
    m.add_argument("inputs", nargs="+", help="run directories to merge")
    m.set_defaults(func=cmd_merge)

    lc = sub.add_parser("list-cells", help="each tier's size, or the cell ids")
    lc.add_argument("--tier")
    lc.add_argument("--family")
    lc.add_argument("--op")
    lc.add_argument("--filter")
    lc.add_argument("--ids", action="store_true", help="print cell ids instead of counts")
    lc.set_defaults(func=cmd_list_cells)

    r = sub.add_parser("report", help="Markdown summary of a run directory")
    r.add_argument("run_dir")
    r.add_argument("--out", help="output file (default RUN_DIR/report.md)")
    r.set_defaults(func=cmd_report)

    s = sub.add_parser("study", help="numerical studies (JSON for the report)")
    ss = s.add_subparsers(dest="study", required=True, parser_class=_Parser)
    from conformance import studies

    for name, mod in studies.studies().items():
        sp = ss.add_parser(name, help=mod.DESCRIPTION)
        sp.add_argument("--out", help="JSON output (default reports/out/study-NAME.json)")
        mod.add_arguments(sp)
        sp.set_defaults(func=cmd_study, study_module=mod)

    for modname in PLUGIN_MODULES:
        if importlib.util.find_spec(modname.rsplit(".", 1)[0]) and importlib.util.find_spec(modname):
            importlib.import_module(modname).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, KeyError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        sys.stderr.write(f"kernel-lab: error: {msg}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
