"""The two references as backends: ``numpy-ref`` and ``jax-ref``, for every family.

Each family's ``run_with(impl, cell, inputs)`` drives the op through a module that has the
reference's function names (``reference.<family>.numpy_ref`` or ``.jax_ref``). The oracle a family
compares them with is an independent computation (fp64, or the other form of the algorithm), so a
reference backend can fail.
"""
from __future__ import annotations

import importlib
import importlib.util

from conformance import families, paths
from conformance.registry import Backend, register


def _ops() -> dict[str, tuple[str, ...]]:
    """Every discovered family that has ``reference/<family>/`` (numpy_ref and jax_ref), all its ops."""
    return {name: tuple(mod.OPS) for name, mod in families.families().items()
            if importlib.util.find_spec(f"reference.{name}") is not None}


def _make(name: str, module: str, probe, path: str, env: dict | None = None) -> Backend:
    def run(cell, inputs):
        impl = importlib.import_module(f"reference.{cell.family}.{module}")
        return families.get(cell.family).run_with(impl, cell, inputs)

    return register(Backend(name=name, ops=_ops(), available=probe, run=run,
                            rounding_models={family: "exact" for family in _ops()}, env=env or {},
                            path=paths.fixed(path)))


def _numpy_available() -> tuple[bool, str]:
    import ml_dtypes  # noqa: F401  (bf16 state pools)
    import numpy

    return True, f"numpy {numpy.__version__}"


def _jax_available() -> tuple[bool, str]:
    try:
        import jax
    except ImportError as exc:
        return False, f"jax is not importable ({exc})"
    return True, f"jax {jax.__version__}, run on the CPU (JAX_PLATFORMS=cpu in its worker)"


NUMPY_REF = _make("numpy-ref", "numpy_ref", _numpy_available, "numpy")
# The JAX reference runs on the CPU: on a GPU, XLA's default float32 matmuls use reduced
# precision (TF32), which is not the reference's arithmetic.
JAX_REF = _make("jax-ref", "jax_ref", _jax_available, "jax", env={"JAX_PLATFORMS": "cpu"})
