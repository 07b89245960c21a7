"""The backend registry. A backend is one module under ``conformance/backends/`` that calls
``register(Backend(...))`` at import; modules are discovered, nothing lists them by hand.
Other packages' backend modules are named by the entry point group ``kernel_lab.backends`` or,
for one call (tests register crashing backends this way), comma-separated in the environment
variable ``KERNEL_LAB_BACKEND_MODULES`` (``conformance.plugins``); worker processes see both.

A backend module must import cheaply: heavy imports (torch, jax, triton, the C++ extension)
happen inside ``available()`` and ``run()``.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

from conformance import paths, plugins
from conformance.cells import Cell, refuse_control_characters
from conformance.errors import UsageError


INTERPRET_ENV = {"TRITON_INTERPRET": "1"}   # the ``env`` of backends that run Triton kernels in its interpreter


def _always(cell: Cell) -> str | None:
    return None


def _undeclared(cell: Cell) -> str:
    return paths.UNKNOWN


@dataclass(frozen=True)
class Backend:
    """What a backend declares.

    name:           registry name, e.g. ``cpu-amx``.
    ops:            family -> ops it implements, e.g. ``{"gdn": ("decode", "chunked")}``.
    available:      probe of this machine: ``(True, "why")`` or ``(False, "why not, in words")``.
    run:            ``run(cell, inputs) -> outputs``: inputs are the family's dict (a private copy
                    the backend may mutate); outputs a dict of NumPy arrays named by the family.
    supports:       ``None`` if the cell is supported, else the reason it is skipped.
    xfail:          ``None``, or the reason the cell is a known failure.
    rounding_models: family -> the name of the oracle variant this backend is held to, one of that
                    family's ``ROUNDING_MODELS``; a family left out is held to "exact".
    env:            environment variables its worker process needs (e.g. ``INTERPRET_ENV``); the worker
                    that runs a pair refuses to run it in a process without them (``env_problem``).
    timeout_s:      per-cell wall-clock limit; past it the worker is killed and the cell is a crash.
    uses_gpu:       runs on a GPU: the runner pins each of its workers to one visible device.
    seconds_per_cell, seconds_per_work: the ETA's first estimate of one cell when
                    ``conformance/run/prices.json`` holds no measured price of the backend,
                    ``seconds_per_cell * estimate.cell_calls(cell) + seconds_per_work * estimate.cell_work(cell)``
                    (a chain of calls pays seconds_per_cell each call), refined from records.
    work_budget:    cells with more work (a number, or op -> number) skip unless asked for (``--no-budget``,
                    ``--filter``); set for the Triton interpreter, a hundred times slower than compiled code.
    probe_call:     the probe also makes one tiny call of the kernels (``conformance.run.probe``): for stacks
                    that import but may not run here (the Triton interpreter under a NumPy it breaks on).
    probe_timeout_s: the probe's limit (available() and the tiny call) before it is killed, and that of
                    each supports() / path() answer the runner asks (``conformance.run.hook_answers``).
    argument_contract: it refuses what its families' ``REFUSALS`` list (``conformance.refusals``), as the
                    references do; False for peers, whose arguments are their own.
    path:           ``path(cell) -> str``: the code path it takes for the cell on this machine
                    (``conformance.paths``: ``amx``, ``sm_90``, ``interpreter``, ``numpy`` ...), asked
                    in a worker process (the pair's after a run; for a skip or a crash, the one the
                    runner asks its hooks in); a run
                    that reports the path it took (``paths.took``) records that instead.

    ``supports`` and ``xfail`` that raise, or return something other than None or a string, make
    the pair an ``error`` record naming the hook.
    """

    name: str
    ops: Mapping[str, tuple[str, ...]]
    available: Callable[[], tuple[bool, str]]
    run: Callable[[Cell, dict], dict]
    supports: Callable[[Cell], str | None] = _always
    xfail: Callable[[Cell], str | None] = _always
    rounding_models: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    uses_gpu: bool = False
    seconds_per_cell: float = 0.05
    seconds_per_work: float = 1e-8
    work_budget: float | Mapping[str, float] | None = None
    probe_call: bool = False
    probe_timeout_s: float = 120.0
    argument_contract: bool = True
    path: Callable[[Cell], str] = _undeclared

    def code_path(self, cell: Cell) -> str:
        """``path(cell)``; one that raises or answers something other than a string is recorded
        as ``unknown: ...`` saying so (the record still says what ran or skipped)."""
        try:
            answer = self.path(cell)
        except Exception as exc:
            return f"{paths.UNKNOWN}: path() raised {type(exc).__name__}: {exc}"
        return answer if isinstance(answer, str) and answer else f"{paths.UNKNOWN}: path() returned {answer!r}"

    def env_problem(self) -> str | None:
        """Why this process cannot run the backend's pairs (a variable of ``env`` unset or other), or None."""
        wrong = {k: v for k, v in self.env.items() if os.environ.get(k) != v}
        if not wrong:
            return None
        needs = " ".join(f"{k}={v}" for k, v in wrong.items())
        has = " ".join(f"{k}={os.environ[k]}" if k in os.environ else f"{k} unset" for k in wrong)
        return f"{self.name} needs {needs} in its process ({has})"

    def rounding_model(self, family: str) -> str:
        """The rounding model this backend is held to in ``family``."""
        return self.rounding_models.get(family, "exact")

    def skip_reason(self, cell: Cell) -> str | None:
        """Why this backend does not run ``cell`` (family, op, or the backend's own limits)."""
        ops = self.ops.get(cell.family)
        if ops is None:
            return f"{self.name} does not implement the {cell.family} family"
        if cell.op not in ops:
            return f"{self.name} does not implement {cell.family}/{cell.op}"
        return self.hook("supports", cell)

    def hook(self, name: str, cell: Cell) -> str | None:
        """``supports(cell)`` or ``xfail(cell)``: None or a reason; HookError when it raises or
        answers something else."""
        try:
            answer = getattr(self, name)(cell)
        except Exception as exc:
            raise HookError(f"{self.name}: {name}() raised {type(exc).__name__}: {exc}") from exc
        if answer is not None and not isinstance(answer, str):
            raise HookError(f"{self.name}: {name}() returned {type(answer).__name__}, expected None or a reason")
        return answer


def worker_env(backend: Backend, gpus: bool) -> tuple:
    """The worker environment a backend runs in where the pool has GPUs (``gpus``) or not: its
    environment variables and whether it runs on a GPU (``uses_gpu`` where there are GPUs; where there
    are none, a GPU backend runs on the CPU, in the CPU workers). The local pool runs a cell's backends
    of one environment in turn on one worker (an *item*, ``workers.items``), and the item's first pair
    draws the cell's inputs and computes its oracles (a record's ``setup_s``) for the rest."""
    return tuple(sorted(backend.env.items())), backend.uses_gpu and gpus


def in_interpreter(backend: Backend) -> bool:
    """The backend runs Triton kernels in Triton's interpreter (its ``env`` holds ``INTERPRET_ENV``)."""
    return INTERPRET_ENV.items() <= dict(backend.env).items()


class HookError(Exception):
    """A backend's ``supports`` or ``xfail`` raised or answered neither None nor a string."""


_REGISTRY: dict[str, Backend] = {}
_ORIGIN: dict[str, str] = {}     # backend name -> the module whose code called register()
_BUILTIN = False
_LOADED = False


def validate(backend: Backend) -> None:
    """Refuse a backend whose families or rounding models are unknown (ValueError naming the known ones)."""
    from conformance import families

    refuse_control_characters("backend name", backend.name)
    for family in sorted(set(backend.ops) | set(backend.rounding_models)):
        try:
            fam = families.get(family)
        except UsageError:
            raise ValueError(f"backend {backend.name!r}: unknown family {family!r}; "
                             f"known: {', '.join(families.families())}") from None
        if family not in backend.ops:
            raise ValueError(f"backend {backend.name!r}: rounding_models names {family!r}, which its ops leave out")
        models = fam.ROUNDING_MODELS
        model = backend.rounding_model(family)
        if model not in models:
            raise ValueError(f"backend {backend.name!r}: unknown {family} rounding model {model!r}; "
                             f"known: {', '.join(models)}")
        unknown_ops = [op for op in backend.ops[family] if op not in fam.OPS]
        if unknown_ops:
            raise ValueError(f"backend {backend.name!r}: unknown {family} ops {unknown_ops}; "
                             f"known: {', '.join(fam.OPS)}")


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry after ``validate``; a second backend of the same name is refused."""
    if backend.name in _REGISTRY and _REGISTRY[backend.name] is not backend:
        raise ValueError(f"backend {backend.name!r} is registered twice")
    validate(backend)
    _REGISTRY[backend.name] = backend
    _ORIGIN[backend.name] = sys._getframe(1).f_globals.get("__name__", "")
    return backend


def _load_builtin() -> None:
    global _BUILTIN
    if _BUILTIN:
        return
    import conformance.backends as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"conformance.backends.{info.name}")
    _BUILTIN = True


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    _load_builtin()
    plugins.load("backends")  # other packages' backends register on import
    _LOADED = True


def backends() -> dict[str, Backend]:
    """All registered backends, by name (sorted)."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def builtin() -> dict[str, Backend]:
    """The backends of this package (registered by ``conformance.backends`` modules), by name (sorted): not
    those of plugins, of KERNEL_LAB_BACKEND_MODULES or of tests, whichever else this process registered."""
    _load_builtin()
    return {n: b for n, b in sorted(_REGISTRY.items()) if _ORIGIN.get(n, "").startswith("conformance.backends.")}


def get(name: str) -> Backend:
    """The backend called ``name``: this package's and the variable's are found without reading
    the installed packages' entry points (a worker process starts faster), others through them."""
    _load_builtin()
    if name not in _REGISTRY and not _LOADED:
        plugins.load("backends", installed=False)
    if name in _REGISTRY:
        return _REGISTRY[name]
    all_ = backends()
    if name not in all_:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(all_)}")
    return all_[name]
