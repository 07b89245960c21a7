"""Backends of the NumPy reference with one planted bug each, registered only in the tests of
`conform --inputs` (KERNEL_LAB_BACKEND_MODULES=tests.unit.planted_backends)."""
import importlib

from conformance.registry import Backend, register


def _planted(name: str, family: str, op: str, bug: str) -> Backend:
    def run(cell, inputs):
        from conformance import families
        from conformance.testing import PLANTED

        impl = PLANTED[bug].plant(importlib.import_module(f"reference.{family}.numpy_ref"))
        return families.get(family).run_with(impl, cell, inputs)

    return register(Backend(name, {family: (op,)}, lambda: (True, f"numpy-ref with {bug} planted"), run))


GDN_TILED = _planted("numpy-ref-heads-tiled", "gdn", "decode", "gdn.head-mapping-tiled")
TQ_WRONG_HEAD = _planted("numpy-ref-wrong-kv-head", "turboquant", "decode", "turboquant.wrong-kv-head")
