"""Whether Triton's interpreter (``TRITON_INTERPRET=1``) can run, with the NumPy it finds, a loop whose
trip count is a runtime scalar: ``for t in range(0, n)`` with ``n`` a kernel argument or a loaded value, as
the GDN kernels (ours and vLLM's) loop over a sequence's tokens and several TurboQuant kernels over a
sequence's blocks.

The interpreter holds every scalar as a 1-element NumPy array of shape (1,) and hands ``range`` the
tensor's ``__index__``. Triton 3.6's interpreter converts it with ``int(array)``, which NumPy 2.4 and later
refuse for an array with a dimension ("only 0-dimensional arrays can be converted to Python scalars");
Triton 3.8's squeezes the array to 0-d first. With the refusing pair every such kernel call raises
``InterpreterError``, whatever the cell; ``runtime_loop_problem`` names the pair before any cell runs.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _runtime_loop_kernel(out_ptr, n):
    """out[i] = i for i < n (int32), through a loop of ``n`` (a runtime int32 scalar) iterations."""
    for i in range(0, n):
        tl.store(out_ptr + i, i)


def _interpreting() -> bool:
    """Whether triton.jit gave interpreter functions in this process (TRITON_INTERPRET=1 at its import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_runtime_loop_kernel, InterpretedFunction)


def runtime_loop_problem() -> str | None:
    """Why this process's Triton interpreter cannot run a loop of a runtime length (naming the Triton
    and NumPy versions), or None when it runs it right or this process does not interpret."""
    if not _interpreting():
        return None
    import numpy
    import torch

    out = torch.full((3,), -1, dtype=torch.int32)
    try:
        _runtime_loop_kernel[(1,)](out, 2)
    except Exception as exc:
        cause = exc.__cause__ or exc
        versions = f"triton {triton.__version__} with numpy {numpy.__version__}"
        if isinstance(cause, TypeError):
            return (f"{versions}: the interpreter turns a runtime scalar (an array of shape (1,)) into a Python "
                    f"int with int(), which NumPy 2.4 and later refuse ({type(cause).__name__}: {cause}), so "
                    "every kernel that loops a runtime number of times fails; a Triton whose interpreter "
                    "squeezes the scalar first (3.8) or a NumPy before 2.4 runs them")
        return f"{versions}: a loop of a runtime length fails in the interpreter ({type(cause).__name__}: {cause})"
    if out.tolist() != [0, 1, -1]:
        return (f"triton {triton.__version__} with numpy {numpy.__version__}: a loop of 2 runtime iterations "
                f"wrote {out.tolist()}, expected [0, 1, -1]")
    return None
