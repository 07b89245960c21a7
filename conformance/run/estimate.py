"""How long a run will take: a cell's work (tokens * heads * head dims), the interpreter work
budget, each backend's price per cell (measured: ``prices.json``, fitted by ``conformance.run.pricing``),
and the ``Estimator`` that rescales them from finished records and pairs in flight and gives the ETA."""
from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from conformance import registry
from conformance.cells import Cell

CHUNK_TOKENS = 64   # a chunked op computes whole chunks of this many tokens


def cell_work(cell: Cell) -> int:
    """A cell's work in tokens * heads * head dims, from its parameters: tokens are ``sum(lens)`` (a
    ``chunked`` op's sequences rounded up to whole chunks of CHUNK_TOKENS), ``ntok``, ``T`` or ``n``, times ``steps`` (a chain of calls); heads
    ``HV`` or ``Hk * G``; dims ``D`` or ``K * K`` (a GDN state). Missing factors count 1. Used to estimate
    run time and for the interpreter work budget."""
    p = cell.as_dict()
    if "lens" in p and cell.op == "chunked":
        tokens = sum(-(-n // CHUNK_TOKENS) * CHUNK_TOKENS for n in p["lens"])
    else:
        tokens = sum(p["lens"]) if "lens" in p else p.get("ntok") or p.get("T") or p.get("n") or 1
    tokens *= p.get("steps", 1)                 # a chain of decode calls
    heads = p.get("HV") or p.get("Hk", 1) * p.get("G", 1)
    dims = p.get("D") or p.get("K", 1) ** 2
    return int(tokens * heads * dims)


def work_budget(cell: Cell, backend: registry.Backend) -> float | None:
    """The backend's work budget for the cell's op (None: no budget)."""
    budget = backend.work_budget
    return budget.get(cell.op) if isinstance(budget, Mapping) else budget


def cell_calls(cell: Cell) -> int:
    """How many times the driver calls the op: a chain's ``steps`` or ``calls``, else 1."""
    p = cell.as_dict()
    return int(p.get("steps") or p.get("calls") or 1)


PRICES = Path(__file__).with_name("prices.json")


@dataclass(frozen=True)
class Price:
    """Seconds a backend takes on this lab's measurement machine, fitted from a run's records
    (``conformance.run.pricing``): ``startup_s`` once per worker (imports, first compiles), then
    per pair ``pair_s`` (inputs, oracle, check, a compile per new shape) plus ``call_s`` per call
    of the op (``cell_calls``) plus ``work_s`` per unit of ``cell_work``. ``ops``: the same per
    ``family/op`` where the run had enough pairs of it (an op's fixed cost differs from another's
    at the same work: a gating cell is a hundredth of a decode's)."""

    startup_s: float = 0.0
    pair_s: float = 0.0
    call_s: float = 0.0
    work_s: float = 0.0
    ops: dict = field(default_factory=dict, compare=False)   # "family/op" -> Price (its startup unused)

    def of(self, cell: Cell) -> "Price":
        """The price of ``cell``'s op where one was measured, else this one."""
        return self.ops.get(f"{cell.family}/{cell.op}", self)

    def at(self, cell: Cell) -> float:
        """Seconds of ``cell`` at the price of its op (``of``), startup apart."""
        p = self.of(cell)
        return p.pair_s + p.call_s * cell_calls(cell) + p.work_s * cell_work(cell)


SETUP = "(cell setup)"   # the prices' name for a cell's setup in a worker (a record's ``setup_s``)



@lru_cache(maxsize=1)
def _prices_file() -> dict:
    """``prices.json`` as read once (``{"backends": {}}`` when absent)."""
    try:
        return json.loads(PRICES.read_text())
    except FileNotFoundError:
        return {"backends": {}}


def machine_kind(gpus: list) -> str:
    """The kind of machine a run's ``gpus`` (``fingerprint.gpus``, run.json) make it: ``"gpu"`` or ``"cpu"``."""
    return "gpu" if gpus else "cpu"


@lru_cache(maxsize=None)
def measured_prices(machine: str | None = None) -> dict[str, Price]:
    """Backend name -> its measured ``Price`` (``prices.json``; empty when the file is absent): those
    fitted on every run, or with ``machine`` (``machine_kind``) those fitted on the runs of machines
    of that kind where it ran there (a GPU machine's host runs the CPU backends on other cores, and
    a GPU backend's pairs on it cost what they cost there; ``torch-sdpa`` takes a twentieth of its
    GPU runs' time on the 2-core CPU machine). Without ``machine`` the prices are the same on every
    machine (``selection.cost_shard`` splits a run by them)."""
    section = _prices_file().get("machines", {}).get(machine, {}) if machine else {}
    return {name: Price(**{**fields, "ops": {op: Price(**f) for op, f in fields.get("ops", {}).items()}})
            for name, fields in {**_prices_file()["backends"], **section}.items()}


@lru_cache(maxsize=1)
def prices_core_share() -> float:
    """The share of a core a worker had while the prices were measured (its CPU time over its wall
    time, the median over the pairs; 1 when the file does not say)."""
    return float(_prices_file().get("measured", {}).get("core_share", 1.0))


def use_prices(path: Path) -> None:
    """Read the measured prices from ``path`` from now on, in place of ``prices.json`` (a replay of
    a run estimated with the prices of its day: ``conformance.run.eta_replay``)."""
    global PRICES
    PRICES = Path(path)
    for cached in (_prices_file, measured_prices, prices_core_share, prices_loops_per_cpu_s):
        cached.cache_clear()


def spin(seconds: float = 0.25) -> dict[str, float]:
    """One busy thread of this process for ``seconds``: ``one_thread``, the share of a core it gets now
    (CPU time over wall time: 1 on a machine with a core to spare, ``cores / (others + 1)`` on a busy
    one), and ``loops_per_cpu_s``, how fast a core of this machine runs Python (loops of
    ``sum(range(1000))`` per CPU second; ``core_slowness``)."""
    wall0, cpu0, loops = time.monotonic(), time.process_time(), 0
    while time.monotonic() - wall0 < seconds:
        sum(range(1000))
        loops += 1
    cpu, wall = time.process_time() - cpu0, max(1e-9, time.monotonic() - wall0)
    return {"one_thread": round(min(1.0, cpu / wall), 3), "loops_per_cpu_s": round(loops / max(cpu, 1e-9))}


@lru_cache(maxsize=1)
def prices_loops_per_cpu_s() -> float | None:
    """``spin``'s ``loops_per_cpu_s`` on the machines the prices were measured on (None: not known)."""
    return _prices_file().get("measured", {}).get("loops_per_cpu_s")


def core_slowness(load: dict | None) -> float:
    """How many times the time of the prices' machine a CPU second's work takes here, before any pair
    has run: the prices' ``loops_per_cpu_s`` over the one in ``load`` (``spin``, run.json); 1 where
    either is not known. On the first Zen EPYC a run's pairs took 2.23 times their prices where the
    share of a core alone said 1.5 (``start_rate``)."""
    here, there = (load or {}).get("loops_per_cpu_s"), prices_loops_per_cpu_s()
    return there / here if here and there else 1.0


def core_share(load: dict | None, jobs: int) -> float:
    """The share of a core each of ``jobs`` workers can expect on a machine whose ``load`` (before the
    run's own work: ``fingerprint.load_now`` plus ``one_thread`` from ``spin``) is as
    given: ``min(1, cores / (others + jobs))``, ``others`` the busy threads of other work, read from
    the spin's share where it fell short of a core (``cores / share - 1``), else from the load
    average (at most a core short of all); 1 when the load is not known."""
    if not load or not load.get("cores"):
        return 1.0
    cores, one = load["cores"], load.get("one_thread")
    if one is not None and one < 0.9:
        others = cores / max(one, 1e-3) - 1
    else:
        others = min(load["load_1m"], cores - 1) if one is not None else load["load_1m"]
    return min(1.0, cores / max(1e-9, others + max(1, jobs)))


def start_rate(share: float, slowness: float = 1.0) -> float:
    """Seconds here per second at the prices before any pair has run: the prices' core share over
    the ``share`` a worker can expect here, times the ``slowness`` of a core here (``core_slowness``)."""
    return prices_core_share() / max(share, 1e-3) * slowness


def price(backend: registry.Backend, machine: str | None = None) -> Price:
    """The backend's measured price (on a ``machine`` of that kind: ``measured_prices``), else its
    declared cost model (``seconds_per_cell`` per call, ``seconds_per_work`` per unit of work, no startup)."""
    return measured_prices(machine).get(backend.name) or Price(call_s=backend.seconds_per_cell,
                                                               work_s=backend.seconds_per_work)


def first_estimate(cell: Cell, backend: registry.Backend, machine: str | None = None) -> float:
    """Seconds the backend is expected to take on the cell, before any record of it, its worker's
    startup and the cell's setup apart: ``price(backend, machine)`` of the cell's op at the cell's
    calls and work."""
    return price(backend, machine).at(cell)


def setup_estimate(cell: Cell, machine: str | None = None) -> float:
    """Seconds a worker's first pair of the cell spends drawing its inputs and computing its oracles
    (``setup_s``), whatever the backend: the measured price of ``SETUP`` (on a ``machine`` of that
    kind: ``measured_prices``) at the cell's calls and work; 0 where none was measured."""
    p = measured_prices(machine).get(SETUP)
    return p.at(cell) if p is not None else 0.0


def startup_estimate(backend: registry.Backend, machine: str | None = None) -> float:
    """Seconds a worker's first pair of the backend takes beyond ``first_estimate``."""
    return price(backend, machine).startup_s


def pair_estimates(cell: Cell, backend: registry.Backend, machine: str | None = None) -> tuple[float, float, float]:
    """Seconds of the pair at the prices, in its three parts: (``first_estimate``, its worker's
    ``startup_estimate`` where it is the worker's first pair of the backend, its cell's
    ``setup_estimate`` where it is the first pair of its item)."""
    return first_estimate(cell, backend, machine), startup_estimate(backend, machine), setup_estimate(cell, machine)


CLASS_RATIO = 4.0   # pairs whose first estimates are this factor apart are rated apart (``Estimator``)


def size_class(estimate: float) -> int:
    """The size class of a pair's first estimate: classes a factor ``CLASS_RATIO`` apart (``k`` holds
    estimates in ``[CLASS_RATIO**k, CLASS_RATIO**(k+1))`` seconds; ``NOISE_S`` and below are one)."""
    return math.floor(math.log(max(estimate, Estimator.NOISE_S)) / math.log(CLASS_RATIO))


@dataclass
class Running:
    """Pairs in flight on one slot since ``since`` (the estimator's clock, ``time.monotonic``): one
    pair on the local pool; on a remote slot the whole call (a cell's backends run there in turn and
    their records come back together, so only the call's start is known). ``first_in_worker``: the
    pair is its worker's first of the backend (None: not known). ``predicted``: the estimator's
    ``prediction`` of them when they began."""

    slot: str
    cell_id: str
    backends: list[str]
    since: float
    first_in_worker: bool | None = None
    predicted: float = 0.0


class Estimator:
    """Remaining wall time of a run, kept per backend.

    A pair's wall time (``wall_s``: dispatch to record, so the worker's start, the inputs, the
    oracle, the kernel and the check) is divided by its first estimate (the measured price, of the
    run's kind of machine where given: ``machine``, ``measured_prices``); the
    backend's *rate* is the ratio of the sums of wall times and estimates over its finished steady
    pairs, older work forgotten over ``HORIZON_S`` estimated seconds (a sum, not a mean of ratios),
    the starting rate of a measured price counting as ``PRIOR_S`` estimated seconds of work, pairs estimated under
    ``NOISE_S`` left out (their time is dispatch jitter: a gating pair priced at a millisecond takes
    1 to 40 here, a decode's 0.25 s holds within 10%). The same rate is kept apart for each *size
    class* of the backend's pairs (``size_class``: first estimates ``CLASS_RATIO`` apart), by the
    same rules, and a pair left is expected at its class's rate: a price fitted over pairs of every
    size is off in opposite directions at the two ends (a pair's fixed cost, the worker's dispatch,
    inputs and check, is a larger share of a small pair: in the saved GPU full tiers ``vllm-gdn``
    ran its quarter-second pairs at 1.2 to 2.1 times their price and its second-long ones at a
    third, ``triton-gdn`` on the H200 at 2.4 and 0.5). A class none of whose steady pairs has
    finished takes its backend's rate, moved by the run's ``size_slope`` (how much faster or slower
    a class runs than the one below it, learned from the backends with two classes finished: on the
    first Zen the larger pairs ran at more of their prices, on the Zen 4 at less; the five committed
    budgeted runs replayed, 2026-12-07, had a row more within 30% on two and none fewer); before the
    run has a slope, where the class is larger than every class finished, the start rate where that
    is lower (what the small pairs' excess says is their fixed cost, which a larger pair pays a
    smaller share of; left to the backend's rate, a chain priced at a minute was expected at three
    times that, held the ETA up to the end as the longest pair left, and took two thirds of its
    price). A
    worker's first pair of a backend pays the backend's startup too (``startup_here``), once per worker (at most
    ``jobs`` of them in each of the run's ``stages``: a budgeted run's second stage starts its
    workers afresh, and on the 2-core machine its first pairs were a third of that stage's time).
    A cell's setup (its inputs and oracles: ``setup_estimate``) is paid once per item (the cell's
    backends of one ``registry.worker_env``), by the item's first pair to begin (or, not told of starts, the
    first record of it to come), and is rated as a backend of its own, ``SETUP``, from records'
    ``setup_s``: the pair teaches its backend's rate by the rest of its time (the first pair of a
    16384-step chain spent 124-250 s on the oracle where the cell's other pairs took 20-42 s); a
    record without ``setup_s`` counts the setup with its own estimate against its wall time.
    A backend in Triton's interpreter (``registry.in_interpreter``) pays each kernel's first call once per
    worker: its first pair of an op in a worker (not the worker's first pair of it) teaches the
    steady rate by at most its prediction (in two saved runs of the 2-core machine such pairs ran a
    median 0.8 to 11 times their price per backend, above the op's later pairs, 0.4 to 4.1 times, for
    15 of 18 backends and runs; taken as they ran, they held the pairs left at up to twice their time
    to the end of a run), and its whole time counts in ``totals``. Compile and autotune time is counted apart: a pair over ``OUTLIER`` times the
    rate's prediction, once the rate rests on ``PRIOR_S`` of finished work (a new shape compiled or
    autotuned), adds only its time above the prediction to
    the backend's compile time, so one long JIT does not rescale every pair left. Pairs left are
    expected to meet compile time as often as the finished steady pairs did. For a backend with a
    measured price, a worker's first pair teaches its startup, not its rate: what it took beyond its
    cell at its size class's rate is the startup each worker still to start is expected to pay
    (``startup_here``; a first pair is mostly its worker's imports and first compiles: a cheap cell
    priced at a tenth of a second took 4 s on the 2-core machine, ``fla``'s first pair on the H100
    machine 12 s at a price of 0.4 s and its later pairs a fifth to nine tenths of theirs; taken as a
    rate, it held the H100 machine's ci run at +29 to +57% for its first minute). A declared cost
    model is a guess: its first pairs are its rate until a steady pair (four FLA cells on the H200
    under a model of 0.05 s a pair took 27-28 s each, every one compiling and autotuning its shape).
    Before any steady pair of a measured backend its rate is the machine's rate (``machine_rate``: how much
    slower or faster this machine is than the prices' machine, the median over the backends seen so
    far of their whole time over their whole estimate, compile and autotune included as the prices
    include them, moved from the start rate by their estimated seconds together, the prior counted
    once for the machine rather than once per backend; a backend's rate with its compile time set apart is no measure of another's: an
    autotuning backend's steady pairs run at a twentieth of its price between its autotunes), else, for a backend with a
    measured price, the ratio of the share of a core a worker had when the prices were measured to
    the share it can expect here now (``share``, from the machine's load before the run), and 1 for
    a declared cost model. Every rate is then scaled by the share of a core a worker got while it
    was learned over the share it gets now (``share_drift``, ``share_now``: the finished pairs' CPU
    time over their wall time, the start rate's at the ``share`` expected from the load): on the
    shared 2-core machine a run's share went from 0.95 to 0.41 a minute in as other jobs began, and
    ``jax-ref``, whose pairs left were all queued after that, stayed at its first minute's rate,
    half its later pairs' time. The sum is divided among the workers. ``eta`` gives a range until
    ``SETTLED_PAIRS`` steady pairs and ``SETTLED_WORK`` of the work have finished.

    Pairs in flight (``began``; a record ends them) count by their elapsed time ``e`` on the
    estimator's ``clock`` against their prediction ``P`` (price times its size class's rate; for a
    worker's first pair, plus its startup, ``startup_here``: ``prediction``): ``P - e`` left, what is left of
    the prediction; past it, what the run's own
    finished pairs that ran as far past their predictions ran beyond that point, the median
    (``overrun_left``: the rest of a pair's life given how long it has lived, read from the run's
    own overruns rather than a fixed share of its time so far: the saved runs replayed with prices
    fitted on the other runs, 2026-12-06, had 415 rows of 695 within 30% against 411), and before any
    finished pair ran so far a share
    ``PAST_DUE`` of its time so far again (measured: in the saved runs of the GPU full tiers of the H100
    and H200, their ci runs, a run of long decode chains and the 2-core machine's ci runs, a pair in
    flight past its prediction ran a median of 0.13 to 0.4 of its time so far again, 0.4 on the GPU
    machines; as long again, the doubling rule, was 2.5 times too long at that median, and the
    longest such pair held the ETA up to the end); past every finished pair's overrun it grows with
    ``e``, so a pair stuck far past its price moves the ETA, and it is never zero or negative for a
    pair running). A pair in flight is counted once, by its own time: it teaches its backend's rate
    when its record comes, not while it runs (pairs of one backend run side by side: in the H200 GPU
    full tier twelve ``fla`` pairs at three times their prediction on one GPU each raised the rate
    of the ``fla`` pairs left, run after them at two, while each was also counted 65 s more in flight;
    and a pair that ends past ``OUTLIER`` times its prediction counts as compile time, not in the
    rate). An executor that does not say when its pairs start leaves them counted at their whole
    prediction until their records come."""

    HORIZON_S = 30.0   # a backend's rate forgets finished work over this many estimated seconds
    SHARE_S = 30.0     # ``share_now`` forgets finished pairs over this many seconds of the clock
    PRIOR_S = 1.5      # estimated seconds of work the starting rate counts for (of 1, 1.25, 1.5, 1.75, 2 and 4,
    # the most rows within 30% in the saved runs, 2026-12-06: 1 let an interpreter backend's first steady pair, which
    # pays its op's first call, set its pairs left at three times their time)
    NOISE_S = 0.02     # pairs estimated under this teach no rate
    OUTLIER = 4.0   # a pair this many times its prediction is compile or autotune
    PAST_DUE = 0.4   # a pair past every finished pair's overrun runs this share of its time so far again (measured)
    SETTLED_PAIRS = 10
    SETTLED_WORK = 0.15
    SPREAD = (0.7, 1.4)   # the range before it settles: the prices' spread across runs of one machine
    UPPER_Z = 1.28   # ``upper_margin``: spreads above the mean, the 90th percentile of a normal error
    MIN_SPREAD_PAIRS = 8   # finished pairs ``spread`` needs
    SLOPE_MIN_S = 0.2   # estimated seconds a size class's steady pairs need to count in ``size_slope``
    SLOPE_CAP = 0.3   # ``size_slope`` at most this either way: a factor of 1.35 a class

    def __init__(self, pending: list[tuple[Cell, registry.Backend]], jobs: int, share: float = 1.0,
                 clock=time.monotonic, stages: list[list[tuple[Cell, registry.Backend]]] | None = None,
                 machine: str | None = None, deadline: float | None = None, slowness: float = 1.0):
        self.jobs = max(1, min(jobs, len(pending) or 1))
        self.machine = machine   # the prices of this kind of machine (``measured_prices``)
        self.deadline = deadline   # the clock's time by which a time budget ends the run (None: no budget)
        self.clock = clock
        self.running: dict[str, Running] = {}     # slot -> the pairs in flight there
        self.overruns: list[float] = []   # finished pairs' wall time over their prediction when they began
        self.start_rate = start_rate(share, slowness)   # ``slowness``: ``core_slowness``
        self.share = share   # the share of a core a worker was expected to get, which ``start_rate`` assumes
        self._cpu_wall = (0.0, 0.0, 0.0)   # (CPU s, wall s, clock) of finished pairs, forgotten over SHARE_S
        self._share_at: dict[str, tuple[float, float]] = {}   # backend -> (share * estimate, estimate), as _sums
        self._run_share_at = (0.0, 0.0)   # the same over every backend's steady pairs, unforgotten
        self.startups_left: Counter = Counter()   # backend -> worker startups still to come
        self.startup_s: dict[str, float] = {}
        self._sums: dict[str, tuple[float, float]] = {}   # backend -> (decayed wall sum, estimate sum)
        self._class_sums: dict[tuple[str, int], tuple[float, float]] = {}   # the same per (backend, size class)
        self.compile_later_s: Counter = Counter()  # backend -> compile/autotune seconds of steady pairs
        self.steady_n: Counter = Counter()        # backend -> finished pairs after a worker's first
        self.finished: Counter = Counter()        # backend -> finished pairs learned from (this run's and resumed)
        self.first_excess: dict[str, tuple[float, int]] = {}   # measured backend -> (seconds, number) of startups
        self.first_sums: dict[str, tuple[float, float]] = {}   # declared backend -> (wall, estimate) of first pairs
        self.totals: dict[str, tuple[float, float]] = {}   # backend -> (wall, estimate) of every pair, compile included
        self._op_of: dict[str, str] = {}          # cell id -> "family/op"
        self._interpreted: dict[str, bool] = {}   # backend -> ``registry.in_interpreter``
        self._ops_seen: set[tuple] = set()        # (slot, interpreted backend, op) its worker has begun
        self._first_of_op: set[tuple[str, str]] = set()   # (cell id, backend) begun first of its op on its worker
        self._begun: set[tuple[str, str]] = set()         # (cell id, interpreted backend) told as begun
        self._ops_done: set[tuple[str, str]] = set()      # (backend, op) of the finished records
        # (backend, size class) -> first estimates of the pairs left out (``leave_out``)
        self.fill: Counter = Counter()
        self.fill_n: Counter = Counter()   # ... and their number
        self._plan(pending)
        for stage in stages or [pending]:   # each stage starts its workers afresh
            for b, n in Counter(b.name for _, b in stage).items():
                self.startups_left[b] += min(n, self.jobs)
        self.total = self.work_left()

    def _plan(self, pending: list[tuple[Cell, registry.Backend]]) -> None:
        """The pairs left: each one's first estimate (``_first``), per (backend, size class) their sum
        (``left``), per backend their number (``n_left``) and its worker startup price; and the
        setup of each item left (a cell's backends of one ``registry.worker_env``: ``_setups``, summed in
        ``left`` under ``SETUP``), which its first pair to begin pays."""
        self.left: Counter = Counter()
        self.n_left: Counter = Counter()
        self._first: dict[tuple[str, str], float] = {}
        self._item_of: dict[tuple[str, str], tuple] = {}   # (cell id, backend) -> its item
        self._setups: dict[tuple, float] = {}               # item not begun -> its setup estimate
        self._setup_of: dict[tuple[str, str], float] = {}   # (cell id, backend) in flight -> the setup it pays
        for cell, b in pending:
            self._plan_pair(cell, b)

    def _plan_pair(self, cell: Cell, b: registry.Backend) -> None:
        """One pair left, as ``_plan`` counts it; its item's setup where the item is not planned yet."""
        self._op_of[cell.id] = f"{cell.family}/{cell.op}"
        self._interpreted[b.name] = registry.in_interpreter(b)
        self._first[cell.id, b.name] = est = first_estimate(cell, b, self.machine)
        self.left[b.name, size_class(est)] += est
        self.n_left[b.name] += 1
        self.startup_s[b.name] = startup_estimate(b, self.machine)
        item = self._item_of[cell.id, b.name] = (cell.id, registry.worker_env(b, self.machine == "gpu"))
        if item not in self._setups:
            self._setups[item] = setup = setup_estimate(cell, self.machine)
            self.left[SETUP, size_class(setup)] += setup

    def replan(self, pending: list[tuple[Cell, registry.Backend]]) -> None:
        """The pairs left are now ``pending`` (a time budget chose again); rates learned so far stay."""
        self._plan(pending)
        self.startups_left = Counter({b: min(n, self.jobs) for b, n in self.n_left.items()})

    def leave_out(self, pairs: list[tuple[Cell, registry.Backend]]) -> None:
        """The pairs a time budget left out are now ``pairs``: a slot whose queue runs dry takes those
        that fit (chosen late: ``budget.next_late``, ``add``), so they count in ``remaining`` where their
        size class's pairs fit before the deadline, each with its cell's setup (an item of its own)."""
        self.fill, self.fill_n = Counter(), Counter()
        for cell, b in pairs:
            for key, est in self._fill_parts(cell, b):
                self.fill[key] += est
                self.fill_n[key] += 1

    def _fill_parts(self, cell: Cell, b: registry.Backend) -> list[tuple[tuple[str, int], float]]:
        """A pair left out as ``fill`` counts it: ((backend, size class), first estimate), and its setup's."""
        est, setup = first_estimate(cell, b, self.machine), setup_estimate(cell, self.machine)
        return [((b.name, size_class(est)), est), ((SETUP, size_class(setup)), setup)]

    def add(self, cell: Cell, backend: registry.Backend, first_in_worker: bool) -> None:
        """One more pair left, taken from those left out (chosen late: ``budget.next_late``): its cell's
        setup unless a pair of its item is still waiting to begin (the pool runs it as an item of its
        own), and its worker's startup where it will be the worker's first pair of the backend
        (``first_in_worker``)."""
        for key, est in self._fill_parts(cell, backend):
            if self.fill_n[key] > 0:
                self.fill[key] -= est
                self.fill_n[key] -= 1
        self._plan_pair(cell, backend)
        self.startups_left[backend.name] += bool(first_in_worker)

    def work_left(self) -> float:
        """Estimated seconds of work left at the prices, before any rescaling: the progress bar's unit."""
        return sum(self.left.values()) + sum(n * self.startup_s[b] for b, n in self.startups_left.items())

    def weight(self, record: dict, setup: float = 0.0) -> float:
        """The estimated seconds of work a finished record stands for (a skip: none), ``setup`` the
        estimated setup it paid."""
        est = self._first.get((record["id"], record["backend"]), 0.0)
        return est + setup + (self.startup_s.get(record["backend"], 0.0) if record.get("first_in_worker") else 0.0)

    def _prior(self, backend: str) -> tuple[float, float]:
        """(seconds, rate) the backend's rate starts from: a measured price at ``start_rate`` for
        ``PRIOR_S``; a declared cost model is a guess, and no prior."""
        return (self.PRIOR_S, self.start_rate) if backend in measured_prices(self.machine) else (0.0, 1.0)

    def _blend(self, backend: str, wall: float, estimate: float) -> float:
        """The rate of sums of wall times and estimates, started from the backend's prior (``_prior``)."""
        prior_s, prior_rate = self._prior(backend)
        return (wall + prior_s * prior_rate) / (estimate + prior_s)

    @property
    def rate(self) -> dict[str, float]:
        """Backend -> the rate of its steady pairs (decayed sums, ``_blend``), for the backends that have one."""
        return {b: self._blend(b, w, e) for b, (w, e) in self._sums.items()}

    def _observe(self, backend: str, estimate: float, wall: float, first_in_worker: bool,
                 first_of_op: bool = False) -> None:
        full = estimate + (self.startup_s.get(backend, 0.0) if first_in_worker else 0.0)
        if full >= self.NOISE_S and (not first_in_worker or backend in measured_prices(self.machine)):
            # a declared cost model has no startup: its first pairs' compile is in no estimate
            w, e = self.totals.get(backend, (0.0, 0.0))
            self.totals[backend] = (w + wall, e + full)
        if first_of_op:   # its excess is the op's first call in this worker, once: not the op's later pairs'
            wall = min(wall, self.backend_rate(backend, size_class(estimate)) * estimate)
        if first_in_worker:
            if backend in measured_prices(self.machine):   # beyond its cell at its class's rate: this worker's startup
                s, n = self.first_excess.get(backend, (0.0, 0))
                excess = wall - estimate * self.backend_rate(backend, size_class(estimate))
                self.first_excess[backend] = (s + excess, n + 1)
            elif full >= self.NOISE_S:   # a declared cost model's first pairs, startup included: its rate for now
                w, e = self.first_sums.get(backend, (0.0, 0.0))
                self.first_sums[backend] = (w + wall, e + full)
            return
        self.steady_n[backend] += 1
        w, e = self._sums.get(backend, (0.0, 0.0))
        size = size_class(estimate)
        rate = self.backend_rate(backend, size)
        if e >= self.PRIOR_S and wall > self.OUTLIER * rate * estimate:   # known well enough: compile
            self.compile_later_s[backend] += wall - rate * estimate
            return
        if estimate < self.NOISE_S:
            return
        keep = math.exp(-estimate / self.HORIZON_S)
        now = self.share_now()
        m, e_at = self._share_at.get(backend, (0.0, 0.0))
        self._share_at[backend] = (keep * m + now * estimate, keep * e_at + estimate)
        self._run_share_at = (self._run_share_at[0] + now * estimate, self._run_share_at[1] + estimate)
        w, e = keep * w + wall, keep * e + estimate
        self._sums[backend] = (w, e)
        w, e = self._class_sums.get((backend, size), (0.0, 0.0))
        self._class_sums[backend, size] = (keep * w + wall, keep * e + estimate)

    def learn(self, cells: dict[str, Cell], backends: dict[str, registry.Backend], recs: list[dict]) -> None:
        """Calibrate from records already in the folder (on resume), as from records of this run
        (``done``): the first record of each item paid its cell's setup (records written before
        ``wall_s`` existed give their ``duration_s``)."""
        paid: set[tuple] = set()   # the items whose first record has been read
        for r in recs:
            if r["id"] in cells and r["backend"] in backends and r["status"] != "skip":
                cell, b = cells[r["id"]], backends[r["backend"]]
                item = cell.id, registry.worker_env(b, self.machine == "gpu")
                setup = setup_estimate(cell, self.machine) if item not in paid else 0.0
                paid.add(item)
                wall = r.get("wall_s", r.get("duration_s"))
                self._observe_record(r, first_estimate(cell, b, self.machine), setup, float(wall or 0.0))

    def began(self, slot: str, cell_id: str, backends: list[str], since: float | None = None,
              first_in_worker: bool | None = None) -> None:
        """The pairs of ``cell_id`` on ``backends`` started on ``slot`` at ``since`` (the clock's time;
        default now); what was in flight there before has ended, and a pair begun again (retried
        elsewhere) is in flight only here."""
        for b in backends:
            self._ended(cell_id, b)
            self._begun_op(slot, cell_id, b, bool(first_in_worker))
            item = self._item_of.get((cell_id, b))
            if item in self._setups:   # the first of its item: it draws the cell's inputs and oracles
                self._setup_of[cell_id, b] = self._setups.pop(item)
        r = self.running[slot] = Running(slot, cell_id, list(backends), self.clock() if since is None else since,
                                         first_in_worker)
        r.predicted = self.prediction(r)

    def _begun_op(self, slot: str, cell_id: str, backend: str, first_in_worker: bool) -> None:
        """Note whether the pair begun on ``slot`` is the first of its op there for an interpreted
        backend (``first_of_op``; a worker's first pair of the backend starts the slot's ops afresh)."""
        if not self._interpreted.get(backend):
            return
        if first_in_worker:
            self._ops_seen -= {k for k in self._ops_seen if k[:2] == (slot, backend)}
        key = slot, backend, self._op_of.get(cell_id)
        if key not in self._ops_seen:
            self._ops_seen.add(key)
            if not first_in_worker:
                self._first_of_op.add((cell_id, backend))
        self._begun.add((cell_id, backend))

    def _is_first_of_op(self, record: dict) -> bool:
        """The finished pair of an interpreted backend was the first of its op in its worker (told of
        starts: ``_begun_op``; else the backend's first record of the op), not its worker's first pair."""
        key, op = (record["id"], record["backend"]), (record["backend"], self._op_of.get(record["id"]))
        first = key in self._first_of_op if key in self._begun else op not in self._ops_done
        self._first_of_op.discard(key)
        self._ops_done.add(op)
        return first and self._interpreted.get(record["backend"], False) and not record.get("first_in_worker")

    def _ended(self, cell_id: str, backend: str) -> None:
        for slot, r in list(self.running.items()):
            if r.cell_id == cell_id and backend in r.backends:
                r.backends.remove(backend)
                if not r.backends:
                    del self.running[slot]

    def done(self, record: dict) -> float:
        """Count the finished record (its pair no longer in flight; the wall time of a pair alone on its
        slot over its prediction when it began joins ``overruns``); returns its weight (``weight``)."""
        wall = float(record.get("wall_s", record.get("duration_s")) or 0.0)
        self.overruns += [wall / r.predicted for r in self.running.values()
                          if r.cell_id == record["id"] and r.backends == [record["backend"]] and r.predicted > 0]
        self._ended(record["id"], record["backend"])
        key = record["id"], record["backend"]
        item = self._item_of.get(key)
        setup = self._setup_of.pop(key, None)
        if setup is None:   # not told it began: the first record of its item paid its setup
            setup = self._setups.pop(item, 0.0) if item in self._setups else 0.0
        weight = self.weight(record, setup)
        est = self._first.pop(key, None)
        if est is None:
            return weight
        b = record["backend"]
        self.left[b, size_class(est)] -= est
        self.left[SETUP, size_class(setup)] -= setup
        self.n_left[b] -= 1
        if record.get("first_in_worker") and self.startups_left[b] > 0:
            self.startups_left[b] -= 1
        self._observe_record(record, est, setup, wall, self._is_first_of_op(record))
        return weight

    def _observe_record(self, record: dict, est: float, setup: float, wall: float, first_of_op: bool = False) -> None:
        """Learn from a finished record of wall time ``wall``, first estimate ``est``, and ``setup`` the
        estimated setup it paid for its item (0: none): the setup it measured (``setup_s``) teaches
        the setup's rate apart and the rest of its time its backend's; a record without ``setup_s``
        (older) counts the setup in its pair's time and estimate together."""
        first, measured = bool(record.get("first_in_worker")), record.get("setup_s")
        self.finished[record["backend"]] += 1
        if record.get("cpu_s") is not None and wall > 0:
            cpu, total, now = self._cpu_wall_now()
            self._cpu_wall = (cpu + min(float(record["cpu_s"]), wall), total + wall, now)
        if setup and measured is not None:
            self._observe(SETUP, setup, float(measured), False)
            self._observe(record["backend"], est, max(0.0, wall - float(measured)), first, first_of_op)
        else:
            self._observe(record["backend"], est + setup, wall, first, first_of_op)

    def compile_per_pair(self, backend: str) -> float:
        """Compile/autotune seconds a pair of ``backend`` left is expected to meet."""
        n = self.steady_n[backend]
        return self.compile_later_s[backend] / n if n else 0.0

    def machine_rate(self, without: str | None = None) -> float:
        """This machine's time against the prices': the median over the backends seen so far of
        their whole time over their whole estimate (steady pairs, and a measured price's first
        pairs with its startup; compile and autotune included, as the prices were fitted), backend
        ``without`` left out, moved from ``start_rate`` by their estimated seconds together against
        ``PRIOR_S`` once where any of them has a measured price (the machine's evidence is every
        backend's pairs together; a prior for each backend held a median of backends of a few
        estimated seconds each near the start rate: 1.5 against 2.1 at two minutes into the
        14-worker H200 chain run); ``start_rate`` before any."""
        seen = {b: (w, e) for b, (w, e) in self.totals.items() if b != without and e > 0}
        if not seen:
            return self.start_rate
        ratios = sorted(w / e for w, e in seen.values())
        est = sum(e for _, e in seen.values())
        prior_s = max(self._prior(b)[0] for b in seen)   # none where every one is a declared cost model
        return (ratios[len(ratios) // 2] * est + prior_s * self.start_rate) / (est + prior_s)

    def _learned_rate(self, backend: str) -> tuple[float, float]:
        """(rate, estimated seconds it rests on) from finished pairs: the steady rate; else for a declared
        cost model its first pairs' (startups included); else the other backends' (``machine_rate``,
        resting on ``PRIOR_S``: a measured backend's first pair teaches its startup, ``startup_here``, not
        its cells' rate); 1 and nothing for a declared cost model before any pair."""
        if backend in self._sums:
            w, e = self._sums[backend]
            return self._blend(backend, w, e), e + self._prior(backend)[0]
        if backend in self.first_sums:   # a declared cost model's first pairs
            w, e = self.first_sums[backend]
            return w / e, e
        if self._sums or self.totals or backend in measured_prices(self.machine):
            return self.machine_rate(without=backend), self.PRIOR_S
        return 1.0, 0.0

    def startup_here(self, backend: str, price: float | None = None) -> float:
        """Seconds here a worker's first pair of ``backend`` takes beyond its cell (its imports and first
        compiles): the mean of what its finished first pairs took beyond their cells at their size
        classes' rates, else the startup ``price`` (default the backend's) at the backend's rate."""
        s, n = self.first_excess.get(backend, (0.0, 0))
        if n:
            return max(0.0, s / n)
        return (self.startup_s.get(backend, 0.0) if price is None else price) * self.backend_rate(backend)

    def _class_rate(self, backend: str, size: int) -> tuple[float, float]:
        """(rate, estimated seconds it rests on) of the backend's pairs of one size class: its steady
        pairs of that class from the backend's prior (``_prior``), as the backend's rate; where none
        of the class has finished, the backend's rate (``_learned_rate``: its first pairs', then the
        machine's), and where other classes of the backend have finished, moved from their mean class
        (weighed by estimated seconds) by the run's ``size_slope`` a class; before the run has one, for
        a measured price at most the start rate where the class is larger than every class finished
        (the class docstring says why)."""
        rate, weight = self._learned_rate(backend)
        if (backend, size) in self._class_sums:
            w, e = self._class_sums[backend, size]
            return self._blend(backend, w, e), e + self._prior(backend)[0]
        seen = {k: e for (b, k), (_, e) in self._class_sums.items() if b == backend and e > 0}
        if not seen:
            return rate, weight
        slope = self.size_slope()
        if slope is not None:
            mean = sum(k * e for k, e in seen.items()) / sum(seen.values())
            return rate * math.exp(slope * (size - mean)), weight
        if size > max(seen) and backend in measured_prices(self.machine):
            return min(rate, self.start_rate), self.PRIOR_S
        return rate, weight

    def size_slope(self) -> float | None:
        """How the rate changes from one size class to the next larger in this run: the slope of the
        logarithm of the class rates (wall over estimate of their steady pairs) over the class, fitted
        by least squares weighed by estimated seconds within each backend of two classes or more with
        ``SLOPE_MIN_S`` each, pooled over those backends, at most ``SLOPE_CAP`` either way; None
        before any backend has two such classes. Its sign is the machine's: a pair's fixed cost is a
        smaller share of a larger pair, so larger classes ran at a smaller share of their prices on
        the Zen 4 EPYC (0.15-0.53 of them), and at more of them on the first Zen (``cpu-scalar`` 2.4
        to 9.3 from its smallest class to its largest), where a fixed correction would be wrong."""
        by: dict[str, list[tuple[int, float, float]]] = {}
        for (b, k), (w, e) in self._class_sums.items():
            if e >= self.SLOPE_MIN_S and w > 0:
                by.setdefault(b, []).append((k, math.log(w / e), e))
        num = den = 0.0
        for points in by.values():
            if len(points) < 2:
                continue
            total = sum(e for _, _, e in points)
            mk = sum(k * e for k, _, e in points) / total
            my = sum(y * e for _, y, e in points) / total
            num += sum(e * (k - mk) * (y - my) for k, y, e in points)
            den += sum(e * (k - mk) ** 2 for k, _, e in points)
        return max(-self.SLOPE_CAP, min(self.SLOPE_CAP, num / den)) if den > 0 else None

    def backend_rate(self, backend: str, size: int | None = None) -> float:
        """Seconds here per estimated second for ``backend`` (its pairs of ``size_class`` ``size``;
        None: all its pairs): the rate learned from finished pairs (``_learned_rate``, ``_class_rate``),
        scaled by the share of a core a worker got while it was learned over the share it gets now
        (``share_drift``)."""
        rate = (self._learned_rate(backend) if size is None else self._class_rate(backend, size))[0]
        return rate * self.share_drift(backend)

    def share_now(self) -> float:
        """The share of a core the run's workers get now: the CPU time of its finished pairs over their
        wall time (a pair's CPU time at most its wall time, as the prices count it), each pair forgotten
        over ``SHARE_S`` seconds of the clock, moved from ``share`` by their wall seconds against ``PRIOR_S``."""
        cpu, wall, _ = self._cpu_wall_now()
        return (cpu + self.PRIOR_S * self.share) / (wall + self.PRIOR_S)

    def _cpu_wall_now(self) -> tuple[float, float, float]:
        """(CPU seconds, wall seconds) of the finished pairs, faded over ``SHARE_S`` to the clock's now, and now."""
        cpu, wall, then = self._cpu_wall
        now = self.clock()
        fade = math.exp(-max(0.0, now - then) / self.SHARE_S)
        return fade * cpu, fade * wall, now

    def share_drift(self, backend: str) -> float:
        """How much slower a worker runs now than while the rate of ``backend`` was learned: the share of
        a core at its steady pairs (``share_now`` when each finished, weighed as its rate weighs them; its
        prior at ``share``) over ``share_now``; for a backend without steady pairs, every backend's steady
        pairs (the machine's rate and the start rate it moves from)."""
        m, e = self._share_at.get(backend, self._run_share_at)
        then = (m + self.PRIOR_S * self.share) / (e + self.PRIOR_S)
        return then / max(self.share_now(), 1e-3)

    def _in_flight(self) -> set[tuple[str, str]]:
        """(cell id, backend) of the pairs in flight."""
        return {(r.cell_id, b) for r in self.running.values() for b in r.backends}

    def _queued(self) -> tuple[Counter, Counter, Counter]:
        """Per (backend, size class) the first estimates, and per backend the number and the worker
        startups of the pairs left that are not in flight."""
        left, n_left, startups = Counter(self.left), Counter(self.n_left), Counter(self.startups_left)
        for setup in self._setup_of.values():
            left[SETUP, size_class(setup)] -= setup
        for r in self.running.values():
            for b in r.backends:
                if (r.cell_id, b) in self._first:
                    left[b, size_class(self._first[r.cell_id, b])] -= self._first[r.cell_id, b]
                    n_left[b] -= 1
                    startups[b] -= bool(r.first_in_worker)
        return left, n_left, startups

    def prediction(self, r: Running) -> float:
        """Seconds the pairs of ``r`` are expected to take from their start: their first estimates
        at their size classes' rates, and a worker's first pair its startup (``startup_here``: a
        backend's first pairs are each worker's imports and first compiles, whatever the cell; a
        long chain that is a worker's first pair runs its calls as the backend's pairs of its size
        do), a steady pair the compile time it is expected to meet;
        the first pair of an item its cell's setup at the setup's rate."""
        total = 0.0
        for b in r.backends:
            pair, startup, setup = self._at_rates(b, self._first.get((r.cell_id, b), 0.0), self.startup_s.get(b, 0.0),
                                                  self._setup_of.get((r.cell_id, b), 0.0))
            total += pair + setup + (startup if r.first_in_worker else self.compile_per_pair(b))
        return total

    def _at_rates(self, backend: str, est: float, startup: float, setup: float) -> tuple[float, float, float]:
        """Estimated seconds of a pair of ``backend`` as seconds here: (its first estimate ``est`` at its
        size class's rate, a worker's startup (``startup_here``, ``startup`` its price), its item's ``setup`` at the
        size class's rate of ``SETUP``)."""
        return (est * self.backend_rate(backend, size_class(est)), self.startup_here(backend, startup),
                setup * self.backend_rate(SETUP, size_class(setup)))

    def expected(self, cell: Cell, backend: registry.Backend) -> tuple[float, float, float]:
        """Seconds here of the pair were it to begin now, at the rates learned so far (as ``prediction``
        expects it), in the three parts of ``pair_estimates``: the pair with the compile time a
        steady pair is expected to meet, its worker's startup, its item's setup."""
        pair, startup, setup = self._at_rates(backend.name, *pair_estimates(cell, backend, self.machine))
        return pair + self.compile_per_pair(backend.name), startup, setup

    def spread(self) -> float:
        """How far the run's finished pairs strayed from their predictions when they began (``overruns``):
        the interquartile range of their logarithms over 1.349 (a standard deviation, were they normal,
        not moved by a few compiles); 0 with fewer than ``MIN_SPREAD_PAIRS`` of them (an executor that
        does not say when its pairs start gives none)."""
        return self._overrun_logs()[1]

    def _overrun_logs(self) -> tuple[float, float]:
        """(median, spread) of the logarithms of ``overruns`` (``spread``); (0, 0) with fewer than
        ``MIN_SPREAD_PAIRS`` of them."""
        logs = sorted(math.log(x) for x in self.overruns if x > 0)
        if len(logs) < self.MIN_SPREAD_PAIRS:
            return 0.0, 0.0
        q1, median, q3 = statistics.quantiles(logs, n=4)
        return median, (q3 - q1) / 1.349

    def pair_upper(self) -> float:
        """The 90th percentile of one pair's time over its expected time, ``exp(median + UPPER_Z spread())``
        of the overruns' logarithms, at least 1: a pair's own error, not a backend rate's (``upper_margin``);
        1 until ``spread`` has pairs. The median counts: where the run's pairs all took a small part of
        their predictions while the rates were still being learned (toy pairs of milliseconds priced at a
        second: the first at 0.2 of it, the next at 0.001-0.002), the spread of those two groups alone
        put the percentile at 60 and no left-out pair started. A pair chosen late starts only where it
        fits at this (``budget.next_late``), so that the deadline seldom stops one."""
        median, spread = self._overrun_logs()
        return math.exp(max(0.0, median + self.UPPER_Z * spread))

    def upper_margin(self, pairs: list[tuple[Cell, registry.Backend]]) -> float:
        """The 90th percentile of the time of ``pairs`` over their expected time (``expected``), at least 1:
        a backend's rate rests on its ``finished`` pairs, ``n`` (a budgeted run's first stage ran one pair
        of each backend and op), so its pairs' time is uncertain by ``spread() / sqrt(n)`` of it; the
        backends' errors are independent, the time's ``UPPER_Z`` of them added in quadrature. On the
        2-core machine's eight saved budgeted runs (2026-12-06, their first stage replayed) the spread
        was 0.54 to 0.98 and the second stage's margin 1.11 to 1.20; on the H100 host's, 1.65 and 1.80."""
        per: Counter = Counter()
        for cell, b in pairs:
            per[b.name] += self.expected(cell, b)[0]
        total, s = sum(per.values()), self.spread()
        if total <= 0 or s <= 0:
            return 1.0
        error = math.sqrt(sum((t * s / math.sqrt(max(1, self.finished[b]))) ** 2 for b, t in per.items()))
        return 1.0 + self.UPPER_Z * error / total

    def running_left(self, r: Running) -> float:
        """Seconds the pairs of ``r`` are expected to run still: ``P - e``, ``P`` their ``prediction``,
        ``e`` their time so far; past due, ``P`` times ``overrun_left(e / P)``, else (no finished pair
        of the run ran that long against its prediction) ``PAST_DUE * e`` (the class docstring says why)."""
        elapsed = max(0.0, self.clock() - r.since)
        p = self.prediction(r)
        if elapsed < p:
            return p - elapsed
        beyond = self.overrun_left(elapsed / p) if p > 0 else None
        return p * beyond if beyond is not None else self.PAST_DUE * elapsed

    def overrun_left(self, x: float) -> float | None:
        """Of the finished pairs that ran past ``x`` times their prediction (``overruns``), the median
        of what they ran beyond it, in predictions (None: none did)."""
        beyond = [q - x for q in self.overruns if q > x]
        return statistics.median(beyond) if beyond else None

    def longest_running(self) -> tuple[Running, float] | None:
        """The pairs in flight the longest and their time so far (None: none in flight)."""
        if not self.running:
            return None
        r = min(self.running.values(), key=lambda r: r.since)
        return r, max(0.0, self.clock() - r.since)

    def per_backend(self) -> dict[str, float]:
        """Backend -> seconds of its pairs left that are not in flight (one worker's time)."""
        out: Counter = Counter()
        left, n_left, startups = self._queued()
        for (b, size), est in left.items():
            out[b] += max(0.0, est) * self.backend_rate(b, size)
        for b in n_left:
            out[b] += (max(0, startups[b]) * self.startup_here(b)
                       + max(0, n_left[b]) * self.compile_per_pair(b))
        return {b: secs for b, secs in out.items() if secs > 0}

    def fill_seconds(self) -> float:
        """Seconds of the pairs left out (``leave_out``) that slots gone idle are expected to take: those
        of each size class whose mean pair, at its rate and ``pair_upper``, fits before the deadline (one
        worker's time), as ``budget.next_late`` takes them."""
        left = self.until_deadline()
        upper = self.pair_upper()
        total = 0.0
        for (b, size), est in self.fill.items():
            n = self.fill_n[b, size]
            if n > 0 and est > 0 and est / n * self.backend_rate(b, size) * upper <= left:
                total += est * self.backend_rate(b, size)
        return total

    def remaining(self) -> float:
        """Seconds left: the work left (pairs in flight by ``running_left``, and the pairs left out that
        slots gone idle are expected to take: ``fill_seconds``) divided among the workers, and at least
        the longest pair left (at its size class's rate, with its item's setup where the item has not
        begun) or in flight (a few long chains on many workers end when the longest does); no more than
        ``until_deadline``."""
        rates: dict[tuple[str, int], float] = {}

        def at_rate(backend: str, est: float) -> float:
            k = backend, size_class(est)
            if k not in rates:
                rates[k] = self.backend_rate(*k)
            return est * rates[k]

        flying = self._in_flight()
        longest = max((at_rate(key[1], est) + at_rate(SETUP, self._setups.get(self._item_of.get(key), 0.0))
                       for key, est in self._first.items() if key not in flying), default=0.0)
        running = [self.running_left(r) for r in self.running.values()]
        return min(self.until_deadline(),
                   max((sum(self.per_backend().values()) + sum(running) + self.fill_seconds()) / self.jobs,
                       longest, *running))

    def until_deadline(self) -> float:
        """Seconds to the time budget's deadline, by which the run ends whatever is left (``inf``
        without a budget): a budgeted run's pairs were chosen at the prices, and where they run slower
        the deadline stops them (a 4m30s ``make conform`` on the 2-core machine, 2026-12-06, said 2m54s
        left at 152 s and 1m09s at 247 s of a command that ended at 275 s, 133 chosen pairs not run)."""
        return math.inf if self.deadline is None else max(0.0, self.deadline - self.clock())

    def compile_remaining(self) -> float:
        """The part of ``remaining`` that is expected compile and autotune time of pairs not started."""
        return sum(max(0, n) * self.compile_per_pair(b) for b, n in self._queued()[1].items()) / self.jobs

    def settled(self) -> bool:
        """Enough pairs have finished for one figure rather than a range."""
        steady = sum(self.steady_n.values())
        return steady >= self.SETTLED_PAIRS and self.total - self.work_left() >= self.SETTLED_WORK * self.total

    def eta(self) -> str:
        """``3m10s``, or ``2m40s-5m20s`` until it has settled (with the compile time expected in it);
        no end beyond a time budget's deadline (``until_deadline``)."""
        left, cap = self.remaining(), self.until_deadline()
        if self.settled():
            text = hms(left)
        else:
            lo, hi = (min(f * left, cap) for f in self.SPREAD)
            text = hms(lo) if lo == hi else f"{hms(lo)}-{hms(hi)}"
        compile_s = self.compile_remaining()
        return text + (f" (compile/autotune {hms(compile_s)})" if compile_s >= 1 else "")


def hms(seconds: float) -> str:
    """Seconds as ``1h02m`` or ``3m07s``; ``?`` when not finite."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
