"""One slot of a remote executor, on its machine: a GPU slot (one device) or the machine's CPU slot,
owning a worker subprocess of the local pool that it keeps between items.

A segfault, abort or timeout of the worker is that pair's ``crash`` record (the local pool's rule
with one device: nowhere else to retry), and the slot goes on with a fresh worker. The slot never
retries a pair itself: the driver decides that, and only when the slot is lost.
"""
from __future__ import annotations

import os

from conformance import fingerprint, registry
from conformance.cells import Cell
from conformance.run import node_report
from conformance.run.workers import LocalPool


def visible_devices_var() -> str:
    """HIP_VISIBLE_DEVICES where the engine pinned an AMD GPU that way, else CUDA_VISIBLE_DEVICES."""
    return "HIP_VISIBLE_DEVICES" if ("HIP_VISIBLE_DEVICES" in os.environ or "ROCR_VISIBLE_DEVICES" in os.environ
                                     ) else "CUDA_VISIBLE_DEVICES"


class SlotHost:
    """``device``: the id of the GPU this slot owns, as the engine named it (None: the CPU slot)."""

    def __init__(self, device: str | None, timeout_s: float | None = None):
        self.devices = fingerprint.Devices(visible_devices_var(), (device,)) if device is not None else None
        self.device = self.devices.label(device) if device is not None else None
        self.pool = LocalPool(1, devices=self.devices, timeout_s=timeout_s, keep_workers=True)

    def report(self, backend_names: list[str]) -> dict:
        """The node report (``node_report.report``) from this slot's process, and its device label."""
        return {**node_report.report(backend_names), "device": self.device}

    def run(self, cell: Cell, backend_names: list[str]) -> list[dict]:
        """The records of ``cell`` on each named backend, in order (one per backend)."""
        out: list[dict] = []
        self.pool.run([(cell, [registry.get(name) for name in backend_names])], out.append)
        return out

    def close(self) -> None:
        self.pool.close()
