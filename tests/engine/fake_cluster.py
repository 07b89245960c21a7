"""A fake remote engine for the remote executor: in-process "nodes" whose slots are real
``SlotHost``s (each with its worker subprocess) called from one thread per slot, each node
answering with this machine's report altered by a spec (its device class, commit, probes), and
able to be lost at its n-th call or to send every record twice.

Run as ``python -m tests.engine.fake_cluster SPEC.json conform ... --executor ray``: the CLI with
``--executor ray`` served by this engine. SPEC: {"nodes": [{"name", "class", "gpus": 0, "cpu":
true, "probes": {backend: [ok, why]}, "commit", "lose_on_call": n, "duplicate": false}]}.
"""
from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from conformance.run import executors
from conformance.run.remote import RemoteExecutor, RemoteSlot, SlotLost
from conformance.run.slot_host import SlotHost


class FakeEngine:
    name = "fake"

    def __init__(self, spec: dict):
        self.spec = {n["name"]: n for n in spec["nodes"]}
        self.calls = {name: 0 for name in self.spec}
        self.lost: set[str] = set()
        self.hosts: list[SlotHost] = []
        self.threads: dict[str, ThreadPoolExecutor] = {}
        self.lock = threading.Lock()

    def start_slots(self, backend_names):
        slots = []
        for name, node in self.spec.items():
            devices = [str(i) for i in range(node.get("gpus", 0))] + ([None] if node.get("cpu", True) else [])
            for device in devices:
                host = SlotHost(device)
                self.hosts.append(host)
                report = host.report(backend_names)
                report["device_class"] = node.get("class", report["device_class"])
                if "commit" in node:
                    report["identity"] = {**report["identity"], "commit": node["commit"]}
                report["probes"] = {**report["probes"], **node.get("probes", {})}
                slot = RemoteSlot(name, report["device"], report, host)
                self.threads[slot.label] = ThreadPoolExecutor(1)
                slots.append(slot)
        return slots

    def submit(self, slot, cell, backend_names):
        node = self.spec[slot.node]
        with self.lock:
            self.calls[slot.node] += 1
            if self.calls[slot.node] == node.get("lose_on_call"):
                self.lost.add(slot.node)
        if slot.node in self.lost:
            future = Future()
            future.set_exception(SlotLost(f"node {slot.node} stopped answering"))
            return future

        def call():
            recs = slot.handle.run(cell, backend_names)
            return recs + recs if node.get("duplicate") else recs
        return self.threads[slot.label].submit(call)

    def wait(self, calls):
        done, _ = wait(calls, return_when=FIRST_COMPLETED)
        return list(done)

    def result(self, call):
        return call.result()

    def node_alive(self, node):
        return node not in self.lost

    def describe(self):
        return {"address": "fake"}

    def close(self):
        for pool in self.threads.values():
            pool.shutdown(wait=True)
        for host in self.hosts:
            host.close()


def main(argv: list[str]) -> int:
    from kernel_lab import cli

    spec = json.loads(open(argv[0]).read())
    real_make = executors.make

    def make(name, **kwargs):
        if name != "ray":
            return real_make(name, **kwargs)
        return RemoteExecutor(FakeEngine(spec))

    executors.make = make
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
