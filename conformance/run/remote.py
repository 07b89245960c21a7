"""The remote executor: the driver's side of a run over the slots of several machines, whatever
engine starts and reaches them (``conformance.run.ray_executor``, or the tests' in-process one).

An engine starts slots (one per GPU of each node, one CPU slot per node; ``conformance.run.slot_host``
runs on the other side) and carries one call at a time to each. This module decides everything
else, the same for every engine:
- every node answers for itself: its identity (a node whose kernel-lab version, commit or C++
  build differs from the driver's is refused, naming it), its device class and its probe of each
  backend; a pair goes only to a node whose probe says available;
- a run covers one device class (``use_class``); nodes of another class take no part;
- a pair runs once; when the engine loses a slot (its process or its machine) with an item in
  flight, the slot is retired and the item retried once on another slot (``retried_from`` names
  the lost slot, ``node/device``); lost twice, or with no slot left to take it, it is a ``crash``;
- pairs that never started when no slot is left stay unrecorded and the run stops (``RunStopped``:
  run.json says ``stopped``), so ``--resume`` runs them.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from conformance import registry
from conformance.cells import Cell
from conformance.errors import RunStopped, UsageError
from conformance.run import node_report
from conformance.run.inprocess import static_record
from conformance.run.workers import by_environment


class SlotLost(Exception):
    """The engine lost the slot (its process or its machine) with a call in flight."""


@dataclass
class RemoteSlot:
    """One slot as the driver sees it: node name, device label (None: the node's CPU slot), the
    node report its process gave, and the engine's handle to it."""

    node: str
    device: str | None
    report: dict
    handle: object

    @property
    def label(self) -> str:
        return f"{self.node}/{self.device or 'cpu'}"


class Engine(Protocol):
    name: str

    def start_slots(self, backend_names: list[str]) -> list[RemoteSlot]: ...
    def submit(self, slot: RemoteSlot, cell: Cell, backend_names: list[str]) -> object: ...
    def wait(self, calls: list) -> list: ...              # at least one finished call; blocks
    def result(self, call) -> list[dict]: ...             # the call's records, or SlotLost
    def node_alive(self, node: str) -> bool: ...
    def describe(self) -> dict: ...
    def close(self) -> None: ...


@dataclass
class _Item:
    cell: Cell
    backends: list[registry.Backend]
    nodes: frozenset                 # nodes whose probes say every one of these backends is available
    gpu: bool = False                # they run on a GPU slot (``registry.worker_env``)
    retried_from: str | None = None  # label of the slot lost with this item in flight


class RemoteExecutor:
    """The run's slots on the nodes of one device class of ``engine``'s cluster (``use_class``)."""

    def __init__(self, engine: Engine):
        self.engine, self.device_class = engine, None
        self.name = engine.name
        self.slots: list[RemoteSlot] = []
        self.nodes: dict[str, dict] = {}
        self.retired: dict[str, str] = {}
        self.started = False

    # -- the cluster -----------------------------------------------------------------------------
    def start(self, backends: list[registry.Backend]) -> None:
        """Start the engine's slots and take each node's report; refuse nodes of other builds."""
        if self.started:
            return
        self.started = True
        self.slots = self.engine.start_slots([b.name for b in backends])
        if not self.slots:
            raise UsageError(f"--executor {self.name}: the cluster offers no slot (no node with a GPU or a CPU)")
        mine = node_report.identity()
        refused = []
        for slot in self.slots:
            node = self.nodes.setdefault(slot.node, {
                "device_class": slot.report["device_class"], "fingerprint": slot.report["fingerprint"],
                "identity": slot.report["identity"], "slots": []})
            node["slots"].append(slot.device or "cpu")
            if slot.device is not None and slot.report["fingerprint"].get("gpus"):
                node["fingerprint"] = slot.report["fingerprint"]   # the view of a GPU slot lists the GPUs
                node["device_class"] = slot.report["device_class"]
            diff = node_report.identity_differences(mine, slot.report["identity"])
            if diff and slot.node not in {r[0] for r in refused}:
                refused.append((slot.node, diff))
        if refused:
            raise UsageError("refused: " + "; ".join(f"node {n} runs another build ({', '.join(d)})"
                                                     for n, d in refused)
                             + "; start every node from the driver's commit and C++ build")

    def classes(self) -> dict[str, list[str]]:
        """Device class -> its nodes."""
        out: dict[str, list[str]] = {}
        for name, node in self.nodes.items():
            out.setdefault(node["device_class"], []).append(name)
        return dict(sorted(out.items()))

    def use_class(self, device_class: str | None) -> None:
        """Run on the nodes of ``device_class`` only (None: the only class of the cluster)."""
        classes = self.classes()
        listing = "; ".join(f"{c}: {', '.join(n)}" for c, n in classes.items())
        if device_class is None:
            if len(classes) > 1:
                raise UsageError(f"the cluster holds nodes of several device classes ({listing}); "
                                 "pass --device-class CLASS, or --device-class all for one run folder per class")
            (device_class,) = classes
        elif device_class not in classes:
            raise UsageError(f"--device-class {device_class}: no node of that class; the cluster has {listing}")
        self.device_class = device_class

    @property
    def active(self) -> list[RemoteSlot]:
        return [s for s in self.slots if self.nodes[s.node]["device_class"] == self.device_class]

    @property
    def jobs(self) -> int:
        return len(self.active)

    def node_answers(self, backend: registry.Backend) -> dict[str, tuple[bool, str]]:
        """Each node's probe of ``backend``, by its slots of the backend's kind (GPU or CPU; a GPU
        backend in a run without a GPU slot: the CPU slots)."""
        out: dict[str, tuple[bool, str]] = {}
        for slot in self.active:
            if not self._fits(slot, backend.uses_gpu):
                continue
            ok, why = slot.report["probes"][backend.name]
            if slot.node not in out or ok:
                out[slot.node] = (bool(ok), str(why))
        kind = "GPU" if backend.uses_gpu else "CPU"
        for node in {s.node for s in self.active}:
            out.setdefault(node, (False, f"no {kind} slot on this node"))
        return dict(sorted(out.items()))

    def probes(self, backends: list[registry.Backend]) -> dict[str, tuple[bool, str]]:
        """Per backend: available if some node can run it; the reason lists each node's answer."""
        out = {}
        for b in backends:
            answers = self.node_answers(b)
            ok = any(a for a, _ in answers.values())
            if ok:
                why = "on " + ", ".join(n for n, (a, _) in answers.items() if a)
            else:
                why = "on no node: " + "; ".join(f"{n}: {w}" for n, (_, w) in answers.items())
            out[b.name] = (ok, why)
        return out

    def info(self) -> dict:
        """For run.json: the engine, the device class, and each node of it with its fingerprint."""
        return {"executor": self.name, **self.engine.describe(), "device_class": self.device_class,
                "nodes": {n: node for n, node in self.nodes.items() if node["device_class"] == self.device_class},
                "slots": [s.label for s in self.active]}

    def slot_name(self, label: str) -> str:
        return f"slot {label}"

    def close(self) -> None:
        self.engine.close()

    # -- the run -----------------------------------------------------------------------------------
    def _items(self, work: list[tuple[Cell, list[registry.Backend]]]) -> list[_Item]:
        """Each cell's backends grouped by worker environment (``registry.worker_env``: a GPU backend
        in a run without a GPU slot runs on the CPU slots, in their workers) and the nodes that can
        run them, in the order of ``work`` within each environment (``workers.by_environment``, as the
        local pool queues them)."""
        gpus = any(s.device is not None for s in self.active)
        eligible = {}
        out = []
        for cell, bks in work:
            groups: dict[tuple, list] = {}
            for b in bks:
                if b.name not in eligible:
                    eligible[b.name] = frozenset(n for n, (ok, _) in self.node_answers(b).items() if ok)
                groups.setdefault((registry.worker_env(b, gpus), eligible[b.name]), []).append(b)
            out += [_Item(cell, group, nodes, gpu=env[1]) for (env, nodes), group in groups.items()]
        return by_environment(out, gpus)

    def _can_take(self, slot: RemoteSlot, item: _Item) -> bool:
        return (slot.label not in self.retired and slot.label != item.retried_from
                and self._fits(slot, item.gpu) and slot.node in item.nodes)

    def _fits(self, slot: RemoteSlot, gpu: bool) -> bool:
        """Whether ``slot`` is of the kind a backend needs: a GPU backend takes a GPU slot, or, where no
        node of the run has one, a CPU slot (as the local pool runs it where no device is visible: its probe
        says whether it can run there). A cluster with GPUs never runs it on a CPU, whichever slot is free first."""
        if (slot.device is not None) == gpu:
            return True
        return gpu and not any(s.device is not None for s in self.active)

    def _record(self, record: dict, slot: RemoteSlot, item: _Item) -> dict:
        record = {**record, "node": slot.node}
        record.setdefault("device", slot.device or "cpu")
        if item.retried_from is not None:
            record["retried_from"] = item.retried_from
        return record

    def run(self, work: list[tuple[Cell, list[registry.Backend]]], emit, began=None, more=None) -> None:
        """Run each cell's backends on the active slots; ``emit(record)`` per pair as each call returns,
        ``began(slot label, cell, backend names, since, None)`` as each call is submitted: a call runs
        its backends in turn and returns their records together, so the driver knows when the call
        started, not when each pair did, nor whether a pair is its worker's first. ``more``: asked for a
        pair chosen late when a slot finds nothing in the queue it can take (``workers.LocalPool.run``;
        the slot's worker environment is that of its last call, and every backend pays its startup)."""
        queue = deque(self._items(work))
        idle = list(self.active)
        calls: dict = {}
        last_env: dict[str, tuple] = {}   # slot label -> the worker environment of its last call
        while True:
            for slot in list(idle):
                if slot.label in self.retired:
                    idle.remove(slot)
                    continue
                item = next((it for it in queue if self._can_take(slot, it)), None)
                if item is not None:
                    queue.remove(item)
                elif more is not None:
                    item = self._late(slot, more, last_env.get(slot.label))
                if item is None:
                    continue
                idle.remove(slot)
                last_env[slot.label] = registry.worker_env(item.backends[0], item.gpu)
                call = self.engine.submit(slot, item.cell, [b.name for b in item.backends])
                calls[call] = (slot, item, time.monotonic())
                if began is not None:
                    began(slot.label, item.cell, [b.name for b in item.backends], calls[call][2], None)
            if not calls:
                break
            for call in self.engine.wait(list(calls)):
                slot, item, started = calls.pop(call)
                try:
                    recs = self.engine.result(call)
                except SlotLost as exc:
                    self._lost(slot, item, str(exc), time.monotonic() - started, queue, emit)
                    continue
                for rec in recs:
                    emit(self._record(rec, slot, item))
                idle.append(slot)
        if queue:
            # pairs that never started say nothing about their kernels: unrecorded, a --resume runs them
            why = ", ".join(f"{label} retired ({why})" for label, why in self.retired.items())
            pairs = sum(len(item.backends) for item in queue)
            raise RunStopped(f"no slot left to run on ({why or 'none can run them'}); {pairs} pair(s) never "
                             "started and are not recorded: continue with --resume once slots are back")

    def _late(self, slot: RemoteSlot, more, env: tuple | None) -> _Item | None:
        """The pair ``more`` gives ``slot`` as an item of its own (None: none given)."""
        gpus = any(s.device is not None for s in self.active)

        def item(cell: Cell | None, b: registry.Backend) -> _Item:
            return _Item(cell, [b], frozenset(n for n, (ok, _) in self.node_answers(b).items() if ok),
                         gpu=registry.worker_env(b, gpus)[1])

        late = more(env, set(), lambda b: self._can_take(slot, item(None, b)))
        return None if late is None else item(*late)

    def _lost(self, slot: RemoteSlot, item: _Item, reason: str, duration: float, queue: deque, emit) -> None:
        """The engine lost ``slot`` running ``item``: retire it (and every slot of its node if the
        node is gone), then retry the item once elsewhere, or record its pairs as crashes."""
        names = ", ".join(b.name for b in item.backends)
        self.retired[slot.label] = f"{reason} on {item.cell.id} ({names})"
        if not self.engine.node_alive(slot.node):
            for other in self.active:
                if other.node == slot.node and other.label not in self.retired:
                    self.retired[other.label] = f"node {slot.node} lost"
        retry = _Item(item.cell, item.backends, item.nodes, item.gpu, retried_from=slot.label)
        if item.retried_from is None and any(self._can_take(s, retry) for s in self.active):
            queue.appendleft(retry)
            return
        before = f"; lost before on {item.retried_from}" if item.retried_from else "; no other slot can run it"
        for b in item.backends:
            rec = {**static_record(item.cell, b, "crash", f"slot {slot.label} lost: {reason}{before}"),
                   "duration_s": duration}
            emit(self._record(rec, slot, item))
