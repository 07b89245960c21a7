"""`kernel-lab bench` (also `python -m bench`): run the benchmark registry, print the gates table,
write the perf JSON.

    python -m bench --device cpu --out reports/out/perf.json
    python -m bench --device gpu --out $OUT/perf.json
    python -m bench --bench gdn/decode --aa 20 --load "..."   # A/A noise + saved run of this machine
    python -m bench --device gpu --gated-only --aa 20 --write-gates --load "..."   # the GPU gates' rates

Exit status: 1 when a gate fails, 2 for a bad request, else 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from conformance.errors import UsageError, needs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bench", action="append", help="bench name(s), e.g. gdn/decode (default: all of --device)")
    p.add_argument("--device", choices=("cpu", "gpu", "all"), default="all", help="benches of this device")
    p.add_argument("--out", default="reports/out/perf.json", help="perf JSON (gates.json is written beside it)")
    p.add_argument("--gates", default=None, help="gates TOML (default bench/gates.toml)")
    p.add_argument("--no-remeasure", action="store_true", help="leave straddling gates ambiguous")
    p.add_argument("--aa", type=int, metavar="PAIRS",
                   help="measure PAIRS A/A pairs (>= 20): write <baselines>/<key>/noise.json and the "
                        "saved run perf.json, and print each gate's false-alarm count")
    p.add_argument("--baselines", metavar="DIR",
                   help="saved runs and A/A noise per machine: read from DIR, and --aa writes into DIR "
                        "(default: baselines/ under the current folder)")
    p.add_argument("--load", default="", help="with --aa: the machine load to record (free text)")
    p.add_argument("--gated-only", action="store_true",
                   help="time only the rows the gates read (their numerators and denominators), not the whole "
                        "registry (with --aa: the saved run and noise hold those rows only)")
    p.add_argument("--write-gates", action="store_true",
                   help="with --aa: write each gate's false-alarm rate on this machine into the gates TOML "
                        "(false_alarm_rate, measured_on and the per-machine false_alarm_rates)")


def register(subparsers) -> None:
    """Add the ``bench`` command to kernel-lab's subparsers."""
    p = subparsers.add_parser("bench", help="benchmarks, ceilings and perf gates (the registry of bench/)")
    add_arguments(p)
    p.set_defaults(func=run_command)


def _usage(message: str):
    sys.stderr.write(f"kernel-lab bench: error: {message}\n")
    raise SystemExit(2)


def _selected(args) -> list[str]:
    from bench import registry

    benches = registry.benches()
    names = [n.strip() for item in (args.bench or []) for n in item.split(",") if n.strip()]
    for n in names:
        if n not in benches:
            _usage(f"--bench {n}: no such bench (known: {', '.join(sorted(benches))})")
    if not names:
        names = [n for n, b in benches.items() if args.device in ("all", b.device)]
    return names


def run_command(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts its OpenMP threads
    try:
        needs("kernel-lab bench", "bench", "pytest_benchmark")
    except UsageError as exc:
        _usage(str(exc))
    from bench import baselines, gates, run

    names = _selected(args)
    if args.baselines:  # read there, in this process and any it starts
        os.environ[baselines.VARIABLE] = str(Path(args.baselines).resolve())
    path = Path(args.gates) if args.gates else gates.GATES_TOML
    if not path.is_file():
        _usage(f"--gates {path}: no such file")
    gate_list = gates.load(path)
    if args.write_gates and args.aa is None:
        _usage("--write-gates: only with --aa PAIRS (the rates come from the A/A pairs)")
    rows = run.gated_rows(gate_list, names) if args.gated_only else None
    if rows == {}:
        _usage(f"--gated-only: no gate of {path} reads the selected benches ({', '.join(names)})")
    if args.aa is not None:
        return _aa(names, gate_list, args, path, rows)
    records = run.measure_all(names, tick=run.ticker(run.planned_calls(names, rows)), rows=rows)
    results = run.judge_all(records, gate_list, remeasure=not args.no_remeasure, rows=rows)
    run.write(Path(args.out), run.perf_json(records, results))
    print(gates.table(results))
    print(f"perf JSON: {args.out}")
    failed = [r for r in results if r["verdict"] == "fail"]
    busy = [r for r in failed if r.get("loaded")]
    if busy:
        worst = max((r["load"] for r in busy), key=lambda x: x["load_1m"])
        print(f"note: {len(busy)} of the {len(failed)} failing gates were measured under load (load average up to "
              f"{worst['load_1m']:g} on {worst['cores']} usable cores): other work shared the machine; "
              "measure again when it is quiet", file=sys.stderr)
    return 1 if failed else 0


def _aa(names: list[str], gate_list, args, path: Path, rows: dict | None) -> int:
    """A/A: ``args.aa`` pairs of runs of unchanged code (``rows``: only those, ``run.gated_rows``).
    Every row is set up once (inputs built, calls prepared: ``run.set_up_all``, all rows held at once; a
    GPU call captured at its first timing and replayed in the later runs) and timed in each of the runs, with the timing of a normal run
    (``bench.timing``); the set-ups are dropped after the last run. Each run's gates are judged as
    deployed (a straddling gate measured again, from the same set-ups), and a fail counts as a false
    alarm; the pairs give each record's regression noise (``bench.baselines.aa_noise``).
    Each finished pair is journaled (``baselines.journal``) and an A/A of the same code, machine, rows and
    gates continues from the pairs there, so the pairs may be measured over several calls.
    ``--write-gates``: each judged gate's rate written into the gates file ``path``."""
    from bench import baselines, gates, machine, registry, run, timing

    if args.aa < baselines.MIN_PAIRS:
        _usage(f"--aa {args.aa}: at least {baselines.MIN_PAIRS} pairs")
    benches = registry.benches()
    mine = [g for g in gate_list if g.benches <= set(names)]
    keys = {d: machine.fingerprint(d)["key"] for d in sorted({benches[n].device for n in (rows or names)})}
    identity = baselines.aa_identity(keys, names, rows, mine)
    journal = baselines.journal_path(list(keys.values()))
    pairs, done, why = baselines.journaled(journal, identity)
    if why:
        print(why)
    pairs = pairs[:args.aa]
    verdicts = {g.name: [v for d in done[:args.aa] for v in d[g.name]] for g in mine}
    todo = args.aa - len(pairs)
    planned = run.planned_rows(names, rows)
    gpu = [reps for device, reps in planned if device == "gpu"]
    cpu = len(planned) - len(gpu)
    print(f"A/A plan: {todo} pairs x {len(planned)} rows, about "
          f"{2 * todo * sum(map(timing.gpu_row_seconds, gpu)):.0f} s of GPU timing"
          + (f" and the time of {cpu} CPU rows" if cpu else "") + ", after setting every row up once"
          + (f"; {len(pairs)} of the {args.aa} pairs were measured before ({journal})" if pairs else ""), flush=True)
    if todo:
        start = time.monotonic()
        set_ups = run.set_up_all(names, rows)
        print(f"set up in {time.monotonic() - start:.0f} s{_gpu_memory(gpu)}", flush=True)
        progress = run.ticker(2 * todo * run.planned_calls(names, rows))
    for i in range(todo):
        pair, judged = [], {g.name: [] for g in mine}
        for _ in range(2):
            start = time.monotonic()
            records = run.time_all(set_ups, tick=progress)
            for g in mine:
                r = gates.judge(g, records, run.remeasurer(dict(records), rows, set_ups))
                judged[g.name].append([r["verdict"], r["ratio"], r["reason"]])
            pair.append(list(records.values()))
            if i == 0:      # the first run captures (and compiles) every row: the second is the steady one
                took = time.monotonic() - start
                print(f"first run {took:.1f} s, captures included" if len(pair) == 1 else
                      f"second run {took:.1f} s: about {(2 * todo - 2) * took:.0f} s for the {2 * todo - 2} runs left",
                      flush=True)
        pairs.append(tuple(pair))
        baselines.journal(journal, identity, pairs[-1], judged)
        for name, vs in judged.items():
            verdicts[name] += vs
    if todo:
        del set_ups   # every row's inputs and captured graphs freed
    gate_noise = {}
    for name, vs in verdicts.items():
        judged = [(v, x) for v, x, _ in vs if v != "skip"]
        gate_noise[name] = ({"false_alarm_rate": f"{sum(v == 'fail' for v, _ in judged)}/{len(judged)}",
                             "remeasured": sum("close" in why for _, _, why in vs),
                             "ratios": [round(x, 4) for _, x in judged]}
                            if judged else {"skipped": vs[0][2]})
    for device, key in keys.items():
        def on(recs, device=device):
            return [r for r in recs if benches[r.extra_info["bench"]].device == device]
        noise = baselines.aa_noise([(on(a), on(b)) for a, b in pairs], args.load)
        noise["gates"] = {g.name: gate_noise[g.name] for g in mine
                          if all(benches[b].device == device for b in g.benches)}
        last = {r.rid: r for r in on(pairs[-1][1])}
        print(f"saved run and noise: {baselines.save(key, run.perf_json(last, []), noise)}")
        for rid, n in noise["records"].items():
            print(f"  {rid:50} threshold {n['threshold']:.2f}  false alarms {n['false_alarm_rate']}  "
                  f"A/A ratios {min(n['ratios']):.3f}-{max(n['ratios']):.3f}")
    journal.unlink(missing_ok=True)   # the pairs are in noise.json now
    print("in-run gates on unchanged code (as deployed, a straddling gate measured again):")
    for name, n in gate_noise.items():
        if "skipped" in n:
            print(f"  {name:44} skipped: {n['skipped']}")
        else:
            print(f"  {name:44} false alarms {n['false_alarm_rate']}, remeasured {n['remeasured']}, "
                  f"ratios {min(n['ratios']):.3f}-{max(n['ratios']):.3f}")
    if args.write_gates:
        rates = {g.name: (gate_noise[g.name]["false_alarm_rate"], machine.fingerprint(benches[next(iter(g.benches))].device)["key"])
                 for g in mine if "false_alarm_rate" in gate_noise[g.name]}
        try:
            path.write_text(gates.with_rates(path.read_text(), rates))
            print(f"false-alarm rates of {len(rates)} gate(s) written into {path}")
        except ValueError as exc:
            known = {g.name: g for g in gate_list}
            print(f"{path} left as it was ({exc}); the lines to put in each gate's block:")
            for name, (rate, key) in rates.items():
                print(f"  [[gate]] {name}:\n" + "\n".join(f"    {line}" for line in gates.rate_lines(known[name], rate, key)))
    return 0


def _gpu_memory(gpu_rows: list) -> str:
    """", holding X GiB of the GPU's Y GiB" when GPU rows are set up on a CUDA device, else ""."""
    if not gpu_rows:
        return ""
    import torch

    if not torch.cuda.is_available():
        return ""
    return f", holding {torch.cuda.memory_allocated() / 2**30:.1f} GiB of the GPU's " \
           f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_command(p.parse_args(argv))
