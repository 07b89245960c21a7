"""`kernel-lab` (also `python -m kernel_lab`): the conformance matrix of reference and optimized
kernels, its reports, studies and benchmarks. Commands are listed below; `kernel-lab COMMAND -h`
says more. The commands of other packages (`plan-blocks`, `flydsl`, `bench`) are registered by
their package's ``cli.register(subparsers)``.

Exit status: 0 every record in the run folder passed (or failed as declared), and some ran;
1 some record fails, errors, crashes or passes unexpectedly (`report --fail-on-new`: a new failure
against the baseline); 2 a bad request (unknown name, malformed argument, a run folder in use,
holding another selection, or unreadable, a missing optional package), told in one line; 3 the run
stopped because its records could not be written (disk full): the records before stay valid;
5 nothing ran: every record is a skip, e.g. every selected backend is unavailable here
(`--allow-nothing-ran` makes that 0); 130 interrupted (Ctrl-C): the records so far are kept, and
the line printed says how to continue; 141 the output pipe was closed (`| head`).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from bench import cli as bench_cli
from conformance import audit, families, fingerprint, registry, studies
from conformance.errors import RunStopped, UsageError, escaped, needs
from conformance.run import budget as time_budget
from conformance.run import counts, executors, merge, node_report, probe, records, repro, runner, selection
from conformance.run.progress import Progress
from optimized.flydsl import cli as flydsl_cli
from planner import cli as planner_cli

SUBCOMMAND_MODULES = (planner_cli, flydsl_cli, bench_cli)
STARTED = time.monotonic()   # a --budget counts from here (the imports above take a few tenths of a second)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _split(values: list[str] | None) -> list[str] | None:
    """Repeated, comma-separated names as one list; None when the option is absent."""
    if values is None:
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
    sys.stdout.flush()
    every = list(registry.backends().values())
    bar, done = Progress(len(every), sys.stderr), [0]

    def tick(name: str) -> None:
        done[0] += 1
        bar.advance(1, f"probed {done[0]}/{len(every)} backends, each in a worker: {name}",
                    finished=done[0] == len(every))

    probes = probe.probe_all(every, tick)
    for name, b in registry.backends().items():
        ok, why = probes[name]
        fams = ", ".join(f"{f}: {' '.join(ops)}" for f, ops in b.ops.items())
        print(f"  {'yes' if ok else 'no ':3} {name:24} {why}")
        print(f"      {fams}")
    return 0


def cmd_list_cells(args) -> int:
    tiers = [args.tier] if args.tier else list(families.TIERS)
    for tier in tiers:
        cells = selection.select_cells(tier, args.family, args.op, args.filter)
        if args.ids:
            for c in cells:
                print(c.id)
            continue
        per = Counter((c.family, c.op) for c in cells)
        print(f"{tier}: {len(cells)} cells")
        for (fam, op), n in sorted(per.items()):
            print(f"  {fam}/{op}: {n}")
    return 0


def _selection(args) -> selection.Selection:
    shard, source = args.shard, None
    if args.shard_count is not None and args.shard != "env":
        raise UsageError("--shard-count: only with --shard env (a Kubernetes indexed job's completions)")
    if args.shard == "env":
        if args.shard_count is not None and args.shard_count < 1:
            raise UsageError(f"--shard-count {args.shard_count}: expected a positive number of parts")
        shard, source = selection.shard_from_env(os.environ, args.shard_count)
    selection.parse_shard(shard)
    names = _split(args.backend)
    return selection.Selection(tier=args.tier, family=args.family, op=args.op,
                               backends=tuple(names) if names is not None else None,
                               filter=args.filter, shard=shard, model=args.model, config=args.config,
                               shard_by=args.shard_by, shard_from=source,
                               inputs=os.path.abspath(args.inputs) if args.inputs else args.inputs)


def fresh_out(base: Path = Path("reports/out")) -> Path:
    """A run folder that does not exist yet: ``base/conform-<date>-<time>`` (``-2``, ``-3`` ... when
    taken), so that every `conform` without --out, a record's repro command included, runs anew."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = base / f"conform-{stamp}", 1
    while out.exists():
        n += 1
        out = base / f"conform-{stamp}-{n}"
    return out


JOBS_PER_CORE = 4


def max_jobs() -> int:
    """The most worker processes ``--jobs`` may ask for here: a few per usable core (workers of GPU
    backends wait on their device), never below the number of visible devices."""
    return max(JOBS_PER_CORE * len(os.sched_getaffinity(0)), len(fingerprint.devices().ids))


MAX_TIMEOUT_S = 7 * 24 * 3600.0


def cmd_conform(args) -> int:
    if args.timeout is not None and not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout {args.timeout}: expected a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S:.0f} (a week)")
    if args.resume and args.out is None:
        raise UsageError("--resume: name the run folder to continue with --out DIR")
    if args.out == "":
        raise UsageError("--out: empty; expected a run folder (leave --out out for a new one)")
    limit = None
    if args.budget is not None:
        seconds = time_budget.parse_seconds(args.budget)
        limit = runner.TimeBudget(args.budget, seconds, STARTED + seconds)
    sel = _selection(args)
    sel.check_names()   # before torch is imported (below, for the devices)
    most = max_jobs()
    if args.jobs is not None and not 1 <= args.jobs <= most:
        raise UsageError(f"--jobs {args.jobs}: expected 1 to {most} worker processes on this machine "
                         f"({JOBS_PER_CORE} per usable CPU core)")
    args.out = args.out or str(fresh_out())
    executor = executors.make(args.executor, jobs=args.jobs, timeout_s=args.timeout, address=args.address)
    options = dict(resume=args.resume, timeout_s=args.timeout, budget=not args.no_budget, time_limit=limit)
    try:
        if args.device_class == "all":
            results = runner.run_each_class(sel, args.out, executor, **options)
        else:
            results = {None: runner.run(sel, args.out, executor=executor, device_class=args.device_class,
                                        **options)}
    finally:
        executor.close()
    for device_class, result in results.items():
        if device_class is not None:
            print(f"device class {device_class}:")
        print(counts.summary_table(result.counts))
        if result.left_out and result.left_out.get("chosen_late"):
            print(f"--budget {result.left_out['budget']}: {result.left_out['chosen_late']} pairs left out at first "
                  "ran, chosen late in the time the chosen ones left")
        if result.left_out and not result.left_out["pairs"]:
            print(f"--budget {result.left_out['budget']}: every pair fit, nothing left out")
        elif result.left_out:
            per = ", ".join(f"{b} {n}" for b, n in result.left_out["per_backend"].items())
            print(f"left out by --budget {result.left_out['budget']}: {result.left_out['pairs']} pairs"
                  + (f" ({per})" if per else "") + f"; run them with: kernel-lab conform --out {result.out_dir} "
                  "--resume (and the same selection)")
        print(f"records: {result.out_dir / 'cells.jsonl'}  run: {result.out_dir / 'run.json'}  "
              f"({result.elapsed_s:.1f} s)")
        _print_verdicts(result.out_dir, sel)
    status = max(r.exit_status for r in results.values())
    if status == runner.NOTHING_RAN:
        reasons = "; ".join(counts.skip_reasons(r.counts) for r in results.values())
        print(f"kernel-lab: nothing ran: every record is a skip ({reasons}); "
              + ("allowed by --allow-nothing-ran" if args.allow_nothing_ran else
                 f"exit status {runner.NOTHING_RAN} (--allow-nothing-ran makes it 0)"), file=sys.stderr)
        return 0 if args.allow_nothing_ran else status
    return status


MAX_VERDICTS = 5


def _print_verdicts(out_dir: Path, sel: selection.Selection) -> None:
    """The verdict paragraph (``repro.verdict``) of a one-pair run's record whatever its status, else
    of each bad record when there are at most MAX_VERDICTS of them (a repro says why it failed)."""
    recs = records.read_partial(out_dir / "cells.jsonl")[0]
    ran = [r for r in recs if r["status"] != "skip"]
    shown = ran if len(ran) == 1 else [r for r in ran if r["status"] in records.BAD_STATUSES]
    if 0 < len(shown) <= MAX_VERDICTS:
        for r in shown:
            print(repro.verdict(r, sel.tier, sel.inputs))


def node_command(fp: dict, address: str | None) -> list[str]:
    """The `ray start` argument list that joins this machine (fingerprint ``fp``) to a lab cluster at
    ``address`` (None: as the head), with its GPUs and CPUs; the device class goes in its environment."""
    gpus, cpus = len(fp["gpus"]), fp["cpu"].get("usable_cores") or fp["cpu"]["cores"]
    where = ["--address", address] if address else ["--head", "--port", "6379"]
    return ["ray", "start", *where, "--num-gpus", str(gpus), "--num-cpus", str(cpus), "--disable-usage-stats"]


def cmd_node(args) -> int:
    fp = fingerprint.fingerprint()
    ident = node_report.identity()
    device_class = args.device_class or node_report.local_device_class()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", device_class):
        raise UsageError(f"--device-class {device_class!r}: expected letters, digits, '.', '_' or '-' (it names "
                         "the class's run folder)")
    print(f"# class {device_class}: {len(fp['gpus'])} GPU(s), {fp['cpu']['model']}; kernel-lab {ident['version']} "
          f"commit {ident['commit']}{' (dirty)' if ident['dirty'] else ''}, C++ build {ident['cpp_build']}")
    argv = node_command(fp, args.address)
    print(shlex.join([f"{node_report.CLASS_ENV}={device_class}", *argv]))
    if not args.start:
        return 0
    import subprocess

    env = {**os.environ, node_report.CLASS_ENV: device_class}
    try:
        return subprocess.run(argv, env=env).returncode
    except FileNotFoundError:
        raise UsageError("node --start: the `ray` command is not on PATH (pip install 'kernel-lab[ray]')") from None


def cmd_merge(args) -> int:
    result = merge.merge(args.inputs, args.out)
    print(counts.summary_table(result.counts))
    print(f"merged {result.records} records from {len(args.inputs)} shards into {result.out_dir}")
    return 1 if any(c[s] for c in result.counts.values() for s in records.BAD_STATUSES) else 0


def cmd_report(args) -> int:
    needs("kernel-lab report", "report", "jinja2", "matplotlib")
    from reports import build  # Jinja2 and matplotlib: needed by this command only

    if args.fail_on_new and args.baseline is None:
        raise UsageError("--fail-on-new: needs --baseline RUN_DIR to compare with")
    if any(not d.strip() for d in args.run_dirs):
        raise UsageError("RUN_DIR: empty; expected a run folder written by conform (or merge)")
    try:
        w = build.write(args.run_dirs, args.out, args.perf, args.baseline, args.study)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for p in w.problems:
        print(f"note: {escaped(p)}", file=sys.stderr)
    print(f"report: {w.index.resolve()} ({w.index.stat().st_size / 1e6:.2f} MB, {w.records} records)\n"
          f"junit:  {w.junit}\nsummary: {w.summary}")
    if args.fail_on_new and w.new_failures:
        print(f"kernel-lab: {w.new_failures} new failure(s) against {args.baseline} (listed in {w.summary})",
              file=sys.stderr)
        return 1
    return 0


def output_file(option: str, text: str) -> Path:
    """``text`` as a file to write (its folder created), checked before any work: UsageError naming
    ``option`` for an empty path, a folder, a FIFO or device, or a folder that cannot be made."""
    if not text.strip():
        raise UsageError(f"{option}: empty; expected a file path")
    path = Path(text)
    if path.exists() and not path.is_file():
        raise UsageError(f"{option} {text}: exists and is not a regular file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{option} {text}: cannot create its folder ({exc.strerror or exc})") from None
    return path


def cmd_audit_tolerances(args) -> int:
    recs, measured_on = audit.read_runs(args.run_dirs)
    names = [args.family] if args.family else list(families.families())
    out = Path(args.out) if args.out else None
    for name in names:
        result = audit.audit(name, recs, measured_on)
        path = out / f"{name}.json" if out else audit.path_of(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        records.dump_json(path, result)
        print(audit.table(result))
        print(f"json: {path}")
    return 0


def cmd_study(args) -> int:
    study = args.study_module
    out = output_file("--out", args.out if args.out is not None else f"reports/out/study-{study.NAME}.json")
    try:
        study.check(args)
    except ValueError as exc:
        raise UsageError(f"study {study.NAME}: {exc}") from None
    result = study.run(args)
    try:
        records.dump_json(out, result)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    print(study.summarize(result))
    print(f"json: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kernel-lab", description=__doc__.split("\n\n")[0].replace("`", ""),
                epilog=__doc__.split("\n\n")[1].replace("`", ""), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kernel-lab {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("doctor", help="fingerprint of this machine and every backend: available or why not")
    d.set_defaults(func=cmd_doctor)

    c = sub.add_parser("conform", help="run the conformance matrix")
    c.add_argument("--family", help="gdn or turboquant (default: all)")
    c.add_argument("--op", help="one op of the family (default: all)")
    c.add_argument("--backend", action="append", help="backend name(s), comma-separated or repeated (default: all; "
                   "`kernel-lab doctor` lists them)")
    c.add_argument("--tier", default="ci", help="smoke, ci or full (default ci)")
    c.add_argument("--filter", help="regular expression searched in cell ids")
    c.add_argument("--out", help="run folder (cells.jsonl, run.json); default: a new reports/out/conform-DATE-TIME")
    c.add_argument("--resume", action="store_true",
                   help="continue the same selection in --out: skip (cell, backend) pairs already recorded")
    c.add_argument("--allow-nothing-ran", action="store_true",
                   help=f"exit 0, not {runner.NOTHING_RAN}, when every record is a skip (e.g. no selected backend is "
                        "available here)")
    c.add_argument("--shard", help="K/N: run the K-th of N parts of the matrix; env: K and N from the batch "
                   "scheduler (Slurm array, Kubernetes indexed job, GitLab parallel, Buildkite parallelism)")
    c.add_argument("--shard-count", type=int, help="N for --shard env in a Kubernetes indexed job (its completions)")
    c.add_argument("--shard-by", choices=selection.SHARD_BY, help="index: cell i to part i mod N (default); "
                   "cost: parts of equal estimated time")
    c.add_argument("--executor", choices=executors.EXECUTORS, default="local",
                   help="local: worker processes on this machine (default); ray: the slots of a Ray cluster")
    c.add_argument("--address", help="--executor ray: the cluster (default $RAY_ADDRESS, else auto; "
                   "local: a Ray on this machine only)")
    c.add_argument("--device-class", help="run the nodes of this device class (default: the only one); "
                   "all: one run folder OUT/CLASS per class")
    c.add_argument("--jobs", type=int, help="worker processes in parallel (default: one per visible GPU "
                   "when a GPU backend is selected, else 1)")
    c.add_argument("--timeout", type=float, help="seconds per (cell, backend) before the worker is killed "
                   "and the pair is a crash (default: each backend's own)")
    c.add_argument("--no-budget", action="store_true",
                   help="run interpreter backends on cells over their work budget too")
    c.add_argument("--budget", metavar="DURATION",
                   help="time budget of the whole command (e.g. 5m, 90s, 1h): run the most informative pairs "
                        "that fit (every backend and op first, then a covering sample), and list those left out "
                        "(run.json's left_out; --resume without --budget runs them)")
    c.add_argument("--model", help="also cells in this shipped model's shapes (planner/configs/NAME.json)")
    c.add_argument("--config", help="also cells in the shapes of this config.json")
    c.add_argument("--inputs", metavar="FILE", help="run one cell whose inputs are the tensors of FILE (.npz or "
                   ".safetensors, keyed by the reference's argument names; with --family and --op; "
                   "conformance/inputs/capture.py writes one)")
    c.set_defaults(func=cmd_conform)

    n = sub.add_parser("node", help="the `ray start` line that joins this machine to a lab cluster")
    n.add_argument("--address", help="the head's address (default: this machine starts the head)")
    n.add_argument("--device-class", help="device class to announce (default: derived from `doctor`)")
    n.add_argument("--start", action="store_true", help="run that line")
    n.set_defaults(func=cmd_node)

    m = sub.add_parser("merge", help="join the run folders of the shards K/N of one selection into one")
    m.add_argument("--out", required=True, help="new run folder")
    m.add_argument("inputs", nargs="+", help="run folders of every shard 1/N .. N/N")
    m.set_defaults(func=cmd_merge)

    lc = sub.add_parser("list-cells", help="each tier's size, or the cell ids")
    lc.add_argument("--tier", help="smoke, ci or full (default: the size of each)")
    lc.add_argument("--family", help="gdn or turboquant (default: all)")
    lc.add_argument("--op", help="one op of the family (default: all)")
    lc.add_argument("--filter", help="regular expression searched in cell ids")
    lc.add_argument("--ids", action="store_true", help="print cell ids instead of counts")
    lc.set_defaults(func=cmd_list_cells)

    r = sub.add_parser("report", help="HTML report, junit.xml and summary.md of run folders")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders written by conform (or merge)")
    r.add_argument("--perf", action="append", help="perf JSON (pytest-benchmark with kernel-lab extra_info), repeatable")
    r.add_argument("--baseline", help="run folder to diff against (its perf.json too, if any)")
    r.add_argument("--study", action="append", help="study JSON (default: study-*.json in and above the run folders)")
    r.add_argument("--out", help="output folder (default: the first RUN_DIR)")
    r.add_argument("--fail-on-new", action="store_true",
                   help="exit 1 when a record fails that did not fail in --baseline (a new failure)")
    r.set_defaults(func=cmd_report)

    a = sub.add_parser("audit-tolerances", help="per tolerance term, the worst margin the records of run folders "
                       "reached: written beside each family's tolerances")
    a.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders of one tier (ci for the committed audit)")
    a.add_argument("--family", help="one family (default: all)")
    a.add_argument("--out", help="folder for FAMILY.json (default: conformance/families/<family>/tolerance_audit.json)")
    a.set_defaults(func=cmd_audit_tolerances)

    s = sub.add_parser("study", help="numerical studies (JSON for the report)")
    ss = s.add_subparsers(dest="study", required=True, parser_class=_Parser)
    for name, mod in studies.studies().items():
        sp = ss.add_parser(name, help=mod.DESCRIPTION)
        sp.add_argument("--out", help="JSON output (default reports/out/study-NAME.json)")
        mod.add_arguments(sp)
        sp.set_defaults(func=cmd_study, study_module=mod)

    for module in SUBCOMMAND_MODULES:
        module.register(sub)
    return p


def version() -> str:
    """The installed distribution's version, or that the code runs uninstalled (PYTHONPATH=.)."""
    try:
        return importlib.metadata.version("kernel-lab")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source tree)"


def _interrupted(argv: list[str], args) -> str:
    """The one line of a Ctrl-C: how many records the run folder keeps, and the command that
    continues it (the same arguments, --out the folder, --resume)."""
    if getattr(args, "func", None) is not cmd_conform or not args.out:
        return "kernel-lab: interrupted"
    out = Path(args.out)
    try:
        kept = len(records.read_partial(out / "cells.jsonl")[0])
    except records.RecordsError:
        kept = 0
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not (a.startswith("--out=") or a == "--resume"):
            rest.append(a)
    again = shlex.join(["kernel-lab", *rest, "--out", str(out), "--resume"])
    return f"kernel-lab: interrupted; {kept} records kept in {out / 'cells.jsonl'}; continue with: {again}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()   # a closed pipe shows here, not at the interpreter's exit
        return status
    except UsageError as exc:
        sys.stderr.write(f"kernel-lab: error: {escaped(str(exc))}\n")
        return 2
    except RunStopped as exc:
        sys.stderr.write(f"kernel-lab: error: {escaped(str(exc))}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("\n" + _interrupted(argv, args) + "\n")
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): no traceback, and nothing more to write on that pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
