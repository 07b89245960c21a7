"""compute-sanitizer over our GPU backends: memcheck on every one, racecheck on those whose kernels
use shared memory.

Each (tool, backend) is one pass: ``kernel-lab conform --backend B`` under ``compute-sanitizer --tool
T --target-processes all`` (the pairs run in worker processes, children of the command), in its own
run folder ``OUT/T-B/`` with the sanitizer's log beside the records (``sanitizer-<pid>.log``, one per
sanitizer session: a pass continued with ``--resume`` adds one). One backend a pass makes the log's
errors that backend's. A pass whose folder holds records continues with ``--resume``.

The cells that call their op more than ``LONG_CALLS`` times (decode chains of thousands of steps)
are left out of their backend's pass and each checked in a pass of its own, ``OUT/T-B-long-N/``: one
sanitizer session, one worker, under ``--launch-count CHECKED_LAUNCHES``, so that the pair's first
launches are checked and the rest run at full speed (with every launch instrumented, the full tier's
4,096- and 16,384-step chains ran past a device call's ten minutes); a backend's long passes run side
by side, each printing to ``conform.log`` in its folder. A chain's later calls launch the same kernels
on the same grid at the same state slots as its first ones; what they add, the state's values, is the
conformance check's to judge. A ``--filter`` among the conform options selects the cells of every pass.

A pair's record turns ``error`` when the worker's output holds a sanitizer report (``report_in``,
called by the worker), as a C++ sanitizer's report makes a ``crash`` under ``make sanitize``; memcheck
also destroys the CUDA context on a precise error (its default), so the kernel's call fails and the
pair is an ``error`` whatever the output holds.

    python -m conformance.run.gpu_sanitizer --out DIR [--tier full] [--tool memcheck,racecheck]
                                            [--backend B,...] [-- CONFORM_OPTIONS...]

``--time-limit S`` interrupts the pass running after S seconds (its records kept) and starts no other.

Exit status: 1 when a log reports an error, a record fails, errors or crashes, or the time limit cut a
pass short; 2 for a bad request; else 0.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conformance.errors import UsageError
from conformance.run import records
from conformance.run.processes import descendants, pid_running
from conformance.run.repro import cell_pattern

TOOLS = ("memcheck", "racecheck")
# Every GPU backend of ours, and where racecheck runs: the kernels that use shared memory (Triton
# dot operands and pipelined loads; the sm_90 Gluon decodes' shared-memory rings and broadcasts), with the
# ops those kernels serve (None: every op of the backend).
SANITIZED = ("triton", "triton-grouped", "triton-lut", "triton-unified", "triton-sm90", "triton-gdn",
             "triton-gdn-sm90")
RACECHECK = {"triton-grouped": None, "triton-lut": None, "triton-unified": None, "triton-sm90": None,
             "triton-gdn": ("gdn", "chunked"), "triton-gdn-sm90": None}
# The other GPU backends, and why compute-sanitizer does not run them.
NOT_SANITIZED = {
    "flydsl-gfx950": "an AMD gfx950 kernel: compute-sanitizer checks NVIDIA GPUs only",
    "torch-sdpa": "torch's own attention, a baseline, not a kernel of ours",
    "fla": "a peer's kernels (FLA)", "vllm-gdn": "a peer's kernels (vLLM)",
    "vllm-triton-tq": "a peer's kernels (vLLM)", "vllm-triton-tq-soa": "a peer's kernels (vLLM)",
    "vllm-triton-tq-unified": "a peer's kernels (vLLM)",
}
LOG = "sanitizer-%p.log"   # %p: the sanitizer's process id, one log per session
# The first line of each report (one space after the =====; its detail lines are indented further)
# of memcheck (invalid or misaligned accesses, hardware exceptions, failed API calls, allocation
# errors) and racecheck ("Error: Race reported ...", "ERROR: Potential WAW hazard ..."; warnings
# apart), and the summary line.
_REPORT = re.compile(r"^=+ ((?:ERROR|Error|WARNING|Warning): .*|Invalid __\w+__ .*|Misaligned .*|Program hit .*|"
                     r"Out-of-range .*|Malloc/Free error.*|Hardware exception.*)$", re.M)
_SUMMARY = re.compile(r"^=+ +ERROR SUMMARY: (\d+) errors?", re.M)


def report_in(text: str) -> str | None:
    """The first compute-sanitizer error report in ``text`` (a worker's output, a log), or None.
    Warnings (a racecheck ``Warning:``) are not errors."""
    for m in _REPORT.finditer(text or ""):
        line = m.group(1).strip()
        if not line.lower().startswith("warning"):
            return line
    m = next((m for m in _SUMMARY.finditer(text or "") if int(m.group(1)) > 0), None)
    return m.group(0).lstrip("= ") if m else None


def count_errors(text: str) -> int:
    """Errors a sanitizer log reports: the sum of its ``ERROR SUMMARY`` lines, or the number of
    error reports when that is larger (a session killed before its summary)."""
    summed = sum(int(n) for n in _SUMMARY.findall(text))
    reports = sum(not m.group(1).lower().startswith("warning") for m in _REPORT.finditer(text))
    return max(summed, reports)


LONG_CALLS = 256         # a cell calling its op more often (the ci tier's chains: 256 calls) gets a pass of its own,
CHECKED_LAUNCHES = 256   # which checks this many of its worker's first kernel launches


@dataclass(frozen=True)
class Pass:
    """One compute-sanitizer session over ``kernel-lab conform`` of one backend (of ``family``/``op``
    where set), its cells chosen by ``filter`` (a ``--filter`` regular expression, None: all); ``long``:
    the index of the long cell (``LONG_CALLS``) the pass checks on its first launches (None: a pass of
    every other cell)."""
    tool: str
    backend: str
    family: str | None = None
    op: str | None = None
    filter: str | None = None
    long: int | None = None

    @property
    def name(self) -> str:
        return f"{self.tool}-{self.backend}" + (f"-long-{self.long}" if self.long is not None else "")


def long_ids(backend: str, cells: list) -> list[str]:
    """Ids of the ``cells`` the backend runs (``skip_reason``: its ops and its ``supports``) that call their
    op more than ``LONG_CALLS`` times: a cell it skips gets no sanitizer session of its own."""
    # here, not at the top: a worker imports this module for ``report_in`` and needs none of these
    from conformance import registry
    from conformance.run.estimate import cell_calls

    b = registry.get(backend)
    return [c.id for c in cells if cell_calls(c) > LONG_CALLS and b.skip_reason(c) is None]


def but(ids: list[str], pattern: str | None = None) -> str | None:
    """A ``--filter`` that matches what ``pattern`` (None: every id) matches except the ``ids``."""
    if not ids:
        return pattern
    rest = f"(?=.*?(?:{pattern}))" if pattern else ""
    return f"^(?!{'|'.join(map(cell_pattern, ids))}){rest}"


def passes(tools: tuple[str, ...] = TOOLS, backends: tuple[str, ...] = SANITIZED, tier: str = "full",
           pattern: str | None = None) -> list[Pass]:
    """memcheck on each backend, racecheck on each that uses shared memory (its ops only), each over the
    tier's cells that ``pattern`` matches (None: all) but the long ones (``long_ids``), and after it a
    pass of each long one; a pass that would select no cell is left out."""
    from conformance.run.selection import select_cells   # here: as in ``long_ids``

    cells = select_cells(tier, pattern=pattern)
    scopes = [("memcheck", b, None, None) for b in backends if "memcheck" in tools]
    scopes += [("racecheck", b, *(RACECHECK[b] or (None, None))) for b in backends
               if "racecheck" in tools and b in RACECHECK]
    out = []
    for tool, b, family, op in scopes:
        scoped = [c for c in cells if family is None or (c.family, c.op) == (family, op)]
        long = long_ids(b, scoped)
        if len(scoped) > len(long):
            out.append(Pass(tool, b, family, op, but(long, pattern)))
        out += [Pass(tool, b, family, op, cell_pattern(i), n) for n, i in enumerate(long)]
    return out


def conform_filter(options: list[str]) -> tuple[str | None, list[str]]:
    """(the ``--filter`` among ``kernel-lab conform`` options, the other options): the passes fold it
    into their own filters."""
    pattern, rest, i = None, [], 0
    while i < len(options):
        if options[i] == "--filter" and i + 1 < len(options):
            pattern, i = options[i + 1], i + 2
            continue
        if options[i].startswith("--filter="):
            pattern = options[i].split("=", 1)[1]
        else:
            rest.append(options[i])
        i += 1
    return pattern, rest


def command(p: Pass, out: Path, tier: str, extra: list[str] = (), sanitizer: str = "compute-sanitizer",
            python: str = sys.executable) -> list[str]:
    """The command line of one pass: ``kernel-lab conform`` of the backend (its family, op and filter
    when the pass names them) into ``out``, under compute-sanitizer with every child process followed and
    its log in ``out``; ``--resume`` when ``out`` already holds records. A long cell's pass: one
    worker, its first ``CHECKED_LAUNCHES`` launches checked. ``extra``: more conform options (no ``--filter``:
    ``conform_filter`` takes it out for ``passes``)."""
    conform = [python, "-m", "kernel_lab", "conform", "--tier", tier, "--backend", p.backend, "--out", str(out)]
    conform += ["--family", p.family] if p.family else []
    conform += ["--op", p.op] if p.op else []
    conform += ["--filter", p.filter] if p.filter else []
    conform += ["--resume"] if (out / "cells.jsonl").exists() else []
    long = p.long is not None
    return [sanitizer, "--tool", p.tool, "--target-processes", "all", "--require-cuda-init", "no",
            *(["--launch-count", str(CHECKED_LAUNCHES)] if long else []), "--log-file", str(out / LOG), *conform,
            *extra, *(["--jobs", "1"] if long else [])]


@dataclass
class Outcome:
    """One pass: the records' counts per status, the errors its logs report and the first report;
    ``returncode`` None: the time limit stopped it."""
    name: str
    tool: str
    returncode: int | None
    statuses: dict
    sanitizer_errors: int
    first_report: str | None
    logs: list[str]

    @property
    def cut(self) -> bool:
        return self.returncode is None

    @property
    def ran(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != "skip")

    @property
    def failed(self) -> bool:
        bad = sum(self.statuses.get(s, 0) for s in records.BAD_STATUSES)
        return self.sanitizer_errors > 0 or bad > 0 or self.returncode not in (0, 1, 5)


def outcome(p: Pass, out: Path, returncode: int | None) -> Outcome:
    """What a pass left in ``out``: its records' statuses and its logs' errors; ``returncode`` None: the
    time limit stopped it."""
    recs = records.read_partial(out / "cells.jsonl")[0] if (out / "cells.jsonl").exists() else []
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    logs = sorted(out.glob(LOG.replace("%p", "*")))
    texts = [log.read_text(errors="replace") for log in logs]
    first = next((r for r in map(report_in, texts) if r), None)
    tool = p.tool if p.long is None else f"{p.tool}, first {CHECKED_LAUNCHES} launches"
    return Outcome(p.name, tool, returncode, statuses, sum(map(count_errors, texts)), first,
                   [str(log) for log in logs])


def table(outcomes: list[Outcome]) -> str:
    from conformance.run.counts import text_table

    rows = [[o.name, o.tool, str(o.ran), str(sum(o.statuses.get(s, 0) for s in records.BAD_STATUSES)),
             str(o.sanitizer_errors), (o.first_report or "")[:100] or _quiet(o)] for o in outcomes]
    return text_table(["pass (its folder)", "tool", "pairs run", "bad records", "sanitizer errors", "first report"],
                      rows, right=(2, 3, 4))


def _quiet(o: Outcome) -> str:
    """The first-report column of a pass whose logs report nothing."""
    if o.cut:
        return f"stopped at the time limit after {o.ran} pair(s)"
    if not o.ran:
        return ("nothing ran: every record a skip (cells.jsonl says why)" if o.statuses else
                "no record: conform ended before its first (its output says why)")
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.run.gpu_sanitizer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder of the passes' run folders (OUT/TOOL-BACKEND)")
    ap.add_argument("--tier", default="full", help="tier of every pass (default full)")
    ap.add_argument("--tool", default=",".join(TOOLS), help="memcheck, racecheck or both (default both)")
    ap.add_argument("--backend", default=",".join(SANITIZED), help=f"of {', '.join(SANITIZED)} (default all)")
    ap.add_argument("--sanitizer", default="compute-sanitizer", help="the compute-sanitizer executable")
    ap.add_argument("--time-limit", type=float, help="seconds for all passes: the pass running then is "
                    "interrupted (its records kept; the same command continues it) and no other starts")
    ap.add_argument("conform_options", nargs="*", help="after --: more `kernel-lab conform` options (--jobs, --timeout)")
    args = ap.parse_args(argv)
    tools = tuple(t.strip() for t in args.tool.split(",") if t.strip())
    backends = tuple(b.strip() for b in args.backend.split(",") if b.strip())
    bad = [t for t in tools if t not in TOOLS] + [b for b in backends if b not in SANITIZED]
    if bad or not tools or not backends or not args.out.strip():
        print(f"gpu_sanitizer: error: unknown tool or backend {', '.join(bad)} (tools: {', '.join(TOOLS)}; "
              f"backends: {', '.join(SANITIZED)}), or an empty --out" if bad else
              "gpu_sanitizer: error: --tool, --backend and --out need a value", file=sys.stderr)
        return 2
    if shutil.which(args.sanitizer) is None:
        print(f"gpu_sanitizer: error: --sanitizer {args.sanitizer}: not found on PATH (it comes with the CUDA "
              "toolkit)", file=sys.stderr)
        return 2
    if args.time_limit is not None and not args.time_limit > 0:
        print(f"gpu_sanitizer: error: --time-limit {args.time_limit}: expected a positive number of seconds",
              file=sys.stderr)
        return 2
    pattern, conform_options = conform_filter(args.conform_options)
    try:
        todo = passes(tools, backends, args.tier, pattern)
    except UsageError as exc:   # an unknown tier, a --filter that is no regular expression
        print(f"gpu_sanitizer: error: {exc}", file=sys.stderr)
        return 2
    if not todo:
        print(f"gpu_sanitizer: error: --filter {pattern}: matches no cell of the {args.tier} tier", file=sys.stderr)
        return 2
    end = time.monotonic() + (args.time_limit if args.time_limit is not None else float("inf"))
    outcomes, not_started = [], []
    for group in side_by_side(todo):
        if time.monotonic() >= end:
            not_started += [p.name for p in group]
            continue
        outs = [Path(args.out) / p.name for p in group]
        cmds = [command(p, out, args.tier, conform_options, args.sanitizer) for p, out in zip(group, outs)]
        for out, cmd in zip(outs, cmds):
            out.mkdir(parents=True, exist_ok=True)
            print("$ " + " ".join(cmd), flush=True)
        logs = [out / "conform.log" for out in outs] if len(group) > 1 else None
        outcomes += [outcome(p, out, rc) for p, out, rc in zip(group, outs, run_until(cmds, end, logs))]
    cut = [o.name for o in outcomes if o.cut] + not_started     # the passes after a cut one never started
    print(table(outcomes))
    if cut:
        print(f"time limit reached: {', '.join(cut)} not finished; the same command continues them")
    return 1 if cut or any(o.failed for o in outcomes) else 0


def side_by_side(todo: list[Pass]) -> list[list[Pass]]:
    """``todo`` in the order given, as groups run at once: a (tool, backend)'s long passes together,
    every other pass alone."""
    return [list(g) for _, g in itertools.groupby(todo, key=lambda p: (p.tool, p.backend, p.long is not None))]


def run_until(cmds: list[list[str]], end: float, logs: list[Path] | None = None) -> list[int | None]:
    """Run ``cmds`` side by side, each in its own process group (its output to the file of ``logs`` where
    given), until each exits (its status) or until ``end`` (monotonic seconds): those still running then
    are stopped (``stop``) and give None."""
    procs = []
    for cmd, log in zip(cmds, logs or [None] * len(cmds)):
        with open(log, "a") if log else contextlib.nullcontext() as output:
            # SIGINT at its default in the child: a process started from a background job inherits it
            # ignored, and the interrupt below would then wait out its grace
            procs.append(subprocess.Popen(cmd, start_new_session=True, stdout=output,
                                          stderr=subprocess.STDOUT if log else None,
                                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)))
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=None if end == float("inf") else max(0.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            break
    late = procs[len(codes):]
    stop(late)
    return codes + [None] * len(late)


STOP_GRACE_S = 30.0   # seconds an interrupted pass has to write its last records before it is killed


def stop(procs: list[subprocess.Popen]) -> None:
    """Interrupt each of ``procs``' process groups and every process below one that left its group
    (SIGINT, as Ctrl-C: conform keeps its records), and kill those still there ``STOP_GRACE_S`` later: a
    process left running holds its run folder's lock, and the same command could not continue the pass (on
    the GPU machine a pass stopped at its time limit still held its folder when the next command came)."""
    escaped = {proc.pid: {pid for pid in descendants(proc.pid) if _group(pid) != proc.pid} for proc in procs}
    for proc in procs:
        _signal(proc.pid, escaped[proc.pid], signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(proc.poll() is None or any(map(pid_running, escaped[proc.pid]))
                                               for proc in procs):
        time.sleep(0.1)
    for proc in procs:
        _signal(proc.pid, escaped[proc.pid], signal.SIGKILL)
        proc.wait()


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(group: int, pids: set[int], sig: int) -> None:
    """Send ``sig`` to process group ``group`` and to each of ``pids``, those gone skipped."""
    for send, target in ((os.killpg, group), *((os.kill, pid) for pid in sorted(pids))):
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    sys.exit(main())
