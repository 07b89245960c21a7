"""An address check for Triton kernels run through its interpreter, which reads and writes whatever address a
pointer holds (an out-of-bounds access reads a neighbour's bytes or crashes, never raises; on a GPU it
faults): inside ``checked_addresses()`` every load and store of a launch must touch, where its mask is on,
bytes of one tensor argument of that launch only (its storage), else ``OutOfBounds`` names the kernel, the
source line of the access and the byte range. An access that lands wholly inside another argument's storage
is not caught. ``conformance.run.inprocess.run_one`` runs every interpreter backend's pair under it.

The hooks wrap the interpreter's ``GridExecutor._init_args_hst`` (the launch's tensor arguments) and
``InterpreterBuilder.create_masked_load`` / ``create_masked_store`` (every ``tl.load`` / ``tl.store``), both
restored on exit."""
from __future__ import annotations

import contextlib
import inspect

import numpy as np


class OutOfBounds(Exception):
    """A masked-on access of an interpreted kernel outside every tensor argument of its launch."""


def _site() -> str:
    """file:line of the innermost frame outside Triton and this module (the jit source being interpreted)."""
    import os

    import triton

    skip = (os.path.dirname(triton.__file__), __file__)
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    return "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@contextlib.contextmanager
def checked_addresses():
    """Raise ``OutOfBounds`` at the first masked-on access of an interpreted kernel outside its arguments."""
    from triton.runtime import interpreter as I

    launch = {"kernel": None, "ranges": []}
    init, load, store = (I.GridExecutor._init_args_hst, I.InterpreterBuilder.create_masked_load,
                         I.InterpreterBuilder.create_masked_store)

    def init_args(self, args_dev, kwargs):
        launch["kernel"] = getattr(self.fn, "__name__", repr(self.fn))
        launch["ranges"] = []
        for name, arg in list(zip(inspect.signature(self.fn).parameters, args_dev)) + list(kwargs.items()):
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                launch["ranges"].append((name, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return init(self, args_dev, kwargs)

    def check(ptrs, mask, what):
        on = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)].astype(np.uint64)
        if on.size == 0:
            return
        size = np.dtype(I._get_np_dtype(ptrs.get_element_ty())).itemsize
        lo, hi = int(on.min()), int(on.max()) + size
        if not any(a <= lo and hi <= b for _, a, b in launch["ranges"]):
            near = ", ".join(f"{name} [{a:#x}, {b:#x})" for name, a, b in launch["ranges"])
            raise OutOfBounds(f"{launch['kernel']}: {what} of bytes [{lo:#x}, {hi:#x}) at {_site()} outside every "
                              f"argument ({near})")

    def masked_load(self, ptrs, mask, other, *rest):
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *rest)

    def masked_store(self, ptrs, value, mask, *rest):
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *rest)

    I.GridExecutor._init_args_hst = init_args
    I.InterpreterBuilder.create_masked_load = masked_load
    I.InterpreterBuilder.create_masked_store = masked_store
    try:
        yield
    except Exception as exc:   # the interpreter wraps what a kernel raises: the check's own error, unwrapped
        cause = exc
        while cause is not None and not isinstance(cause, OutOfBounds):
            cause = cause.__cause__ or cause.__context__
        if cause is None or cause is exc:
            raise
        raise cause from None
    finally:
        I.GridExecutor._init_args_hst = init
        I.InterpreterBuilder.create_masked_load = load
        I.InterpreterBuilder.create_masked_store = store
