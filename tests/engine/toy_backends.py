"""Backends registered only in engine tests (KERNEL_LAB_BACKEND_MODULES=tests.engine.toy_backends)."""
import os

import numpy as np

from conformance.registry import Backend, register


class _Good:
    @staticmethod
    def scale(x, factor):
        return (x * np.float32(factor)).astype(np.float32)


class _Bf16X:
    @staticmethod
    def scale(x, factor):
        from conformance.numerics import bf16_round
        return (bf16_round(x) * np.float32(factor)).astype(np.float32)


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
register(Backend("toy-bf16-x", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Bf16X),
                 rounding_models={"toy": "bf16-x"}))
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


def _raising(cell, inputs):
    raise ValueError("bad input " + "x" * 10_000)


def _warning(cell, inputs):
    import warnings
    warnings.warn("overflow encountered in the toy kernel", RuntimeWarning)
    return _run(_Good)(cell, inputs)


def _faulting_on_device_1(cell, inputs):
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
        os.abort()  # stands for an illegal address that kills the process
    return _run(_Good)(cell, inputs)


def _faulting_everywhere_but_cpu(cell, inputs):
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        os.abort()
    return _run(_Good)(cell, inputs)


register(Backend("toy-raise", {"toy": ("scale",)}, lambda: (True, "always"), _raising))
register(Backend("toy-warn", {"toy": ("scale",)}, lambda: (True, "always"), _warning))
register(Backend("toy-interpreted", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good),
                 seconds_per_cell=0.0, seconds_per_work=100.0, work_budget={"scale": 9}))
# priced at a day a cell: no machine's rate brings a pair of it within a test's time budget
register(Backend("toy-costly", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good), seconds_per_cell=86400.0))
register(Backend("toy-gpu", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good), uses_gpu=True))
register(Backend("toy-gpu-fault-1", {"toy": ("scale",)}, lambda: (True, "always"), _faulting_on_device_1,
                 uses_gpu=True))
register(Backend("toy-gpu-fault-all", {"toy": ("scale",)}, lambda: (True, "always"),
                 _faulting_everywhere_but_cpu, uses_gpu=True))


def _slow(cell, inputs):
    import time
    time.sleep(float(os.environ.get("KERNEL_LAB_TOY_SLOW_S", "0.5")))
    return _run(_Good)(cell, inputs)


def _segfaulting(cell, inputs):
    """Notes the cell in the file KERNEL_LAB_TOY_COUNTER (one line per execution), then segfaults."""
    import signal
    with open(os.environ["KERNEL_LAB_TOY_COUNTER"], "a") as fh:
        fh.write(cell.id + "\n")
    os.kill(os.getpid(), signal.SIGSEGV)


# Available only where the machine's TOY_FEATURE=1 (the remote executor's per-node probes).
register(Backend("toy-feature", {"toy": ("scale",)},
                 lambda: (True, "TOY_FEATURE=1") if os.environ.get("TOY_FEATURE") == "1" else (False, "no TOY_FEATURE"),
                 _run(_Good)))
register(Backend("toy-gpu-slow", {"toy": ("scale",)}, lambda: (True, "always"), _slow, uses_gpu=True))
register(Backend("toy-gpu-segv", {"toy": ("scale",)}, lambda: (True, "always"), _segfaulting, uses_gpu=True))

def _avail_hangs():
    import time
    time.sleep(600)


def _avail_raises():
    raise RuntimeError("the driver is missing")


def _avail_aborts():
    os.abort()


def _raises(cell):
    raise KeyError("n")


def _stack_broken(cell, inputs):
    raise TypeError("only length-1 arrays can be converted to Python scalars")


register(Backend("toy-avail-hangs", {"toy": ("scale",)}, _avail_hangs, _run(_Good), probe_timeout_s=2.0))
register(Backend("toy-avail-raises", {"toy": ("scale",)}, _avail_raises, _run(_Good)))
register(Backend("toy-avail-aborts", {"toy": ("scale",)}, _avail_aborts, _run(_Good)))
register(Backend("toy-supports-raises", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good), supports=_raises))
register(Backend("toy-supports-lies", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good),
                 supports=lambda cell: 5))
register(Backend("toy-xfail-raises", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good), xfail=_raises))
register(Backend("toy-stack-broken", {"toy": ("scale",)}, lambda: (True, "imports fine"), _stack_broken,
                 probe_call=True))


def _bad_on_9(fault):
    """A hook that does ``fault`` on the cell n = 9 and answers plainly on the others."""
    def hook(cell):
        if cell["n"] == 9:
            fault()
        return None if hook.kind == "supports" else "toy-declared"
    return hook


def _sleep():
    import time
    time.sleep(60)


def _segfault():
    import signal
    os.kill(os.getpid(), signal.SIGSEGV)


def _exit_3():
    os._exit(3)   # the runner's own disk-full exit status


for _name, _fault, _kind in (("hangs", _sleep, "supports"), ("segfaults", _segfault, "supports"),
                             ("exits", _exit_3, "supports"), ("hangs", _sleep, "path"),
                             ("segfaults", _segfault, "path")):
    _hook = _bad_on_9(_fault)
    _hook.kind = _kind
    register(Backend(f"toy-{_kind}-{_name}", {"toy": ("scale",)}, lambda: (True, "always"), _run(_Good),
                     probe_timeout_s=2.0, **{_kind: _hook}))


def _chatty(cell, inputs):
    import sys
    print("x" * (2 << 20))
    sys.stderr.write("e" * (2 << 20) + "\n")
    os.write(1, b"raw" * (1 << 20))
    return _run(_Good)(cell, inputs)


register(Backend("toy-chatty", {"toy": ("scale",)}, lambda: (True, "always"), _chatty))


def _choosing_path(cell, inputs):
    """Reports the path it took (chosen at run time by n), as the C++ kernels' backends do."""
    from conformance import paths
    paths.took("toy-odd" if cell["n"] % 2 else "toy-even")
    return _run(_Good)(cell, inputs)


register(Backend("toy-path", {"toy": ("scale",)}, lambda: (True, "always"), _choosing_path,
                 supports=lambda cell: None if cell["n"] < 10 else "only n < 10",
                 path=lambda cell: "toy-declared"))


def _sanitizer_reporting(cell, inputs):
    """Prints what compute-sanitizer's memcheck prints for an out-of-bounds store, on odd n."""
    if cell["n"] % 2 == 1:
        print("========= Invalid __global__ write of size 4 bytes\n=========     at toy_kernel+0x70\n"
              "=========     by thread (3,0,0) in block (0,0,0)", flush=True)
    return _run(_Good)(cell, inputs)


register(Backend("toy-sanitizer-report", {"toy": ("scale",)}, lambda: (True, "always"), _sanitizer_reporting))
