"""Backends registered only in engine tests (KERNEL_LAB_BACKEND_MODULES=tests.engine.toy_backends)."""
import os

import numpy as np

from conformance.registry import Backend, register


class _Good:
    @staticmethod
    def scale(x, factor):
        return (x * np.float32(factor)).astype(np.float32)


class _Wrong:
    @staticmethod
    def scale(x, factor):
        return (x * np.float32(factor) + 1e-3).astype(np.float32)


def _run(impl):
    def run(cell, inputs):
        from tests.engine import toy_family
        return toy_family.run_with(impl, cell, inputs)
    return run


def _aborting(cell, inputs):
    if cell["n"] % 2 == 1:
        os.abort()
    return _run(_Good)(cell, inputs)


def _hanging(cell, inputs):
    import time
    time.sleep(60)


register(Backend("toy-good", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good)))
register(Backend("toy-wrong", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Wrong)))
register(Backend("toy-abort", {"toy": ("scale",)}, lambda: (True, "always"), _aborting))
register(Backend("toy-hang", {"toy": ("scale",)}, lambda: (True, "always"), _hanging, timeout_s=3.0))
register(Backend("toy-wrong-known", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Wrong),
                 xfail=lambda cell: "adds 1e-3 (known)"))
register(Backend("toy-good-marked", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good),
                 xfail=lambda cell: "marked as failing by mistake"))
register(Backend("toy-unsupported", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good),
                 supports=lambda cell: None if cell["n"] < 9 else "only n < 9"))
register(Backend("toy-absent", {"toy": ("scale",)}, lambda: (False, "needs hardware this machine lacks"),
                 _run(_Good)))
