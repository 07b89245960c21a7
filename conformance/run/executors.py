"""Where a run's pairs execute: ``local`` (the worker pool of this machine, ``conformance.run.workers``)
or ``ray`` (the slots of a Ray cluster, ``conformance.run.remote`` over ``conformance.run.ray_executor``).

An executor is started on the selected backends, then says which device classes it has and which
backends it can run (``probes``), runs the planned pairs (``run(work, emit, began, more)``, one record
per pair through ``emit``; ``began(slot, cell, backend_names, since, first_in_worker)`` as pairs start on
a slot, ``since`` a ``time.monotonic()``, for the ETA; ``more(env, seen, can_run)`` asked for a pair
chosen late when a slot has nothing left to take, ``workers.LocalPool.run``), reports what it retired
(``retired``) and describes itself for run.json (``info``). The executor is not part of the selection: a run
folder can be resumed by another.
"""
from __future__ import annotations

import socket

from conformance import fingerprint, registry
from conformance.cells import Cell
from conformance.errors import UsageError
from conformance.run import node_report, probe
from conformance.run.workers import LocalPool

EXECUTORS = ("local", "ray")


def default_jobs(backends: list[registry.Backend], devices: fingerprint.Devices, probes: dict) -> int:
    """One worker per visible device when a GPU backend is selected and available, else one."""
    gpu = any(b.uses_gpu and probes[b.name][0] for b in backends)
    return max(1, len(devices.ids)) if gpu else 1


class LocalExecutor:
    """This machine's worker pool: ``jobs`` workers (default ``default_jobs``), one node."""

    name = "local"

    def __init__(self, jobs: int | None = None, timeout_s: float | None = None):
        self.requested_jobs, self.timeout_s = jobs, timeout_s
        self.devices = fingerprint.devices()
        self.node = socket.gethostname()
        self.jobs = jobs or 1
        self.retired: dict[str, str] = {}
        self.device_class = None

    def start(self, backends: list[registry.Backend]) -> None:
        self._probes = probe.probe_all(backends)
        self.jobs = (self.requested_jobs if self.requested_jobs is not None
                     else default_jobs(backends, self.devices, self._probes))
        self.device_class = node_report.local_device_class()

    def classes(self) -> dict[str, list[str]]:
        return {self.device_class: [self.node]}

    def use_class(self, device_class: str | None) -> None:
        if device_class not in (None, self.device_class):
            raise UsageError(f"--device-class {device_class}: this machine is of class {self.device_class} "
                             "(--executor local runs on this machine only)")

    def probes(self, backends: list[registry.Backend]) -> dict[str, tuple[bool, str]]:
        return {b.name: self._probes[b.name] for b in backends}

    def info(self) -> dict:
        return {"executor": self.name, "device_class": self.device_class, "jobs": self.jobs,
                "devices": [self.devices.label(d) for d in self.devices.ids],
                "nodes": {self.node: {"device_class": self.device_class, "fingerprint": fingerprint.fingerprint(),
                                      "identity": node_report.identity()}}}

    def run(self, work: list[tuple[Cell, list[registry.Backend]]], emit, began=None, more=None) -> None:
        pool = LocalPool(self.jobs, devices=self.devices, timeout_s=self.timeout_s)
        self.retired = pool.retired   # device id -> why
        pool.run(work, lambda record: emit({**record, "node": self.node}), began, more)

    def slot_name(self, device: str) -> str:
        return f"device {self.devices.label(device)}"

    def close(self) -> None:
        pass


def make(name: str, *, jobs: int | None = None, timeout_s: float | None = None, address: str | None = None):
    """The executor called ``name`` (one of ``EXECUTORS``); a usage error for options it does not take."""
    if name == "local":
        if address is not None:
            raise UsageError("--address: only with --executor ray")
        return LocalExecutor(jobs, timeout_s)
    if name == "ray":
        if jobs is not None:
            raise UsageError("--jobs: only with --executor local (the ray executor runs one slot per GPU "
                             "and one CPU slot per node)")
        from conformance.run import ray_executor, remote

        ray_executor.import_ray()
        return remote.RemoteExecutor(ray_executor.RayEngine(address, timeout_s))
    raise UsageError(f"--executor {name!r}: expected one of {', '.join(EXECUTORS)}")
