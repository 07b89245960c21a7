"""The Ray engine of the remote executor (``conformance.run.remote``): on every alive node of the
cluster, one actor per GPU (``num_gpus=1``: Ray picks the device and sets CUDA_VISIBLE_DEVICES)
and one CPU actor if the node offers a CPU, each pinned to its node and holding a
``conformance.run.slot_host.SlotHost``. Ray's own retries are off (``max_restarts=0``,
``max_task_retries=0``, no exception retries): a lost actor is the driver's business.

``address``: a running cluster (``ray start --head`` ...; default ``$RAY_ADDRESS``, else ``auto``),
or ``local`` for a private single-node Ray started for this run. Ray is an optional extra
(``pip install 'kernel-lab[ray]'``).

A ``local`` Ray is the driver's own: a reaper process (``_reap``) holds the list of its processes and
ends them when the driver dies without closing it (kill -9), since Ray's agents outlive their raylet.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import tempfile
from pathlib import Path

from conformance.cells import Cell
from conformance.errors import UsageError
from conformance.run import spawn
from conformance.run.node_report import CLASS_ENV
from conformance.run.processes import descendants, started_at
from conformance.run.remote import RemoteSlot, SlotLost
from conformance.run.slot_host import SlotHost

START_TIMEOUT_S = 300.0     # for every slot to start and report
REACH_TIMEOUT_S = 10.0      # for a TCP connection to a host:port address before Ray is asked
# Variables of the driver that every slot needs too (backend and family modules named for a run).
FORWARDED_PREFIX = "KERNEL_LAB_"
NOT_FORWARDED = (CLASS_ENV, "KERNEL_LAB_FAKE_DEVICES")


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray, which is not installed: pip install 'kernel-lab[ray]' "
                         "(make setup installs it)") from None
    return ray


def unreachable(address: str) -> str | None:
    """Why a ``host:port`` (or ``ray://host:port``) address takes no TCP connection within
    ``REACH_TIMEOUT_S``, or None (reached, or an address of another form: ``auto``, ``local``)."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]]+?)\]?:(\d+)", address)
    if not m:
        return None
    try:
        socket.create_connection((m[1], int(m[2])), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


@contextlib.contextmanager
def _stderr_held():
    """Ray's log while it connects (its C++ core writes to fd 2 itself) held in a file, written out only
    when the connection succeeds: a failure is one line, not Ray's retries."""
    with tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode("utf-8", "replace"))
        sys.stderr.flush()


def _undo_thread_limit() -> None:
    """Ray sets OMP_NUM_THREADS to an actor's CPUs (1 for the slots here) where the node's own
    environment does not set it; the local pool's workers inherit no such limit, nor do ours."""
    try:
        node_env = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\0")   # the raylet's
    except OSError:
        return
    if not any(v.startswith(b"OMP_NUM_THREADS=") for v in node_env):
        os.environ.pop("OMP_NUM_THREADS", None)


def _reap(conn) -> None:
    """The reaper: takes {pid: start time} lists; on None it ends (the driver closed Ray itself), on
    the pipe's end (the driver died) it kills each listed process that is still the one listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the driver's to handle
    listed: dict[int, str] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            return
        listed.update(msg)
    for pid, started in listed.items():
        if started_at(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class _Slot:
    """The actor: a SlotHost on the GPU Ray gave it (``gpu``) or on the node's CPU."""

    def __init__(self, gpu: bool, timeout_s: float | None):
        import ray

        _undo_thread_limit()
        device = None
        if gpu:
            ids = ray.get_runtime_context().get_accelerator_ids().get("GPU") or []
            device = str(ids[0])
        self.host = SlotHost(device, timeout_s)

    def report(self, backend_names):
        return self.host.report(backend_names)

    def run(self, cell, backend_names):
        return self.host.run(cell, backend_names)

    def close(self):
        self.host.close()


def _names(nodes: list[dict]) -> dict[str, str]:
    """Node id -> name: its host name, with the id's first 6 digits where host names repeat."""
    hosts = [n["NodeManagerHostname"] for n in nodes]
    return {n["NodeID"]: n["NodeManagerHostname"] if hosts.count(n["NodeManagerHostname"]) == 1
            else f"{n['NodeManagerHostname']}-{n['NodeID'][:6]}" for n in nodes}


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None = None, timeout_s: float | None = None):
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.timeout_s = timeout_s
        self.ray = None
        self.actors: list = []
        self.node_ids: dict[str, str] = {}   # node name -> Ray node id
        self.reaper = None                   # (process, pipe) while a local Ray of this driver runs

    def _connect(self) -> None:
        ray = import_ray()
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIX) and k not in NOT_FORWARDED}
        runtime_env = {"env_vars": env} if env else None
        advice = "start one with `ray start --head`, or pass --address local for a Ray on this machine only"
        why = unreachable(self.address)
        if why is not None:
            raise UsageError(f"--address {self.address}: no Ray cluster reached ({why}); {advice}")
        try:
            with _stderr_held():
                if self.address == "local":
                    ray.init(address="local", include_dashboard=False, log_to_driver=False,
                             runtime_env=runtime_env, object_store_memory=100 << 20)
                else:
                    ray.init(address=self.address, log_to_driver=False, runtime_env=runtime_env)
        except ConnectionError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--address {self.address}: no Ray cluster reached ({first}); {advice}") from None
        self.ray = ray   # connected: close() disconnects (before, a call to Ray would start one here)
        if self.address == "local":
            self.reaper = spawn.start(_reap, (), {})
            self._list_for_reaper()

    def _list_for_reaper(self) -> None:
        """Give the reaper the driver's Ray processes alive now (the reaper itself left out)."""
        if self.reaper is not None:
            found = descendants(os.getpid())
            found.pop(self.reaper[0].pid, None)
            self.reaper[1].send(found)

    def start_slots(self, backend_names: list[str]) -> list[RemoteSlot]:
        self._connect()
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(max_restarts=0, max_task_retries=0)(_Slot)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        names = _names(nodes)
        placed = []
        for node in nodes:
            name = names[node["NodeID"]]
            self.node_ids[name] = node["NodeID"]
            where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            for _ in range(int(node["Resources"].get("GPU", 0))):
                placed.append((name, actor.options(num_cpus=0, num_gpus=1, scheduling_strategy=where)
                               .remote(True, self.timeout_s)))
            if node["Resources"].get("CPU", 0) >= 1:
                placed.append((name, actor.options(num_cpus=1, scheduling_strategy=where)
                               .remote(False, self.timeout_s)))
        self.actors = [a for _, a in placed]
        calls = [a.report.remote(backend_names) for a in self.actors]
        ready, pending = ray.wait(calls, num_returns=len(calls), timeout=START_TIMEOUT_S)
        if pending:
            late = sorted({placed[calls.index(c)][0] for c in pending})
            raise UsageError(f"--executor ray: slots on {', '.join(late)} did not start within "
                             f"{START_TIMEOUT_S:g} s (their GPUs or CPUs held by other work?)")
        slots = []
        for (name, a), call in zip(placed, calls):
            try:
                report = ray.get(call)
            except ray.exceptions.RayError as exc:
                raise UsageError(f"--executor ray: a slot on node {name} failed to start: "
                                 f"{str(exc).splitlines()[0]}") from None
            slots.append(RemoteSlot(name, report["device"], report, a))
        self._list_for_reaper()
        return slots

    def submit(self, slot: RemoteSlot, cell: Cell, backend_names: list[str]):
        return slot.handle.run.remote(cell, backend_names)

    def wait(self, calls: list) -> list:
        ready, rest = self.ray.wait(calls, num_returns=1)
        if rest:
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        return ready

    def result(self, call) -> list[dict]:
        exc_types = self.ray.exceptions
        try:
            return self.ray.get(call)
        except exc_types.RayTaskError:
            raise   # the slot's own code raised: a kernel-lab bug, not a lost slot
        except (exc_types.RayActorError, exc_types.ObjectLostError, exc_types.NodeDiedError) as exc:
            raise SlotLost(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}") from None

    def node_alive(self, node: str) -> bool:
        node_id = self.node_ids.get(node)
        return any(n["NodeID"] == node_id and n["Alive"] for n in self.ray.nodes())

    def describe(self) -> dict:
        return {"address": self.address, "ray": getattr(self.ray, "__version__", None)}

    def close(self) -> None:
        """Stop each slot's worker, end the actors, and disconnect (a ``local`` Ray stops with it)."""
        if self.ray is None:
            return
        ray = self.ray
        try:
            ray.wait([a.close.remote() for a in self.actors], num_returns=len(self.actors), timeout=10)
        except ray.exceptions.RayError:
            pass
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        ray.shutdown()
        self.ray = None
        if self.reaper is not None:
            spawn.stop(*self.reaper)
            self.reaper = None
