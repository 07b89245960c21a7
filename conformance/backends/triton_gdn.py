"""Our Triton GDN kernels (``optimized.triton.gdn_recurrent``: decode, spec_decode, recurrent;
``optimized.triton.gdn_chunked``: chunked) as backends of the gdn family: ``triton-gdn`` on a GPU (the GDN
dispatcher's choice per call) and ``triton-gdn-interpret``, the same kernels through the Triton interpreter
(``TRITON_INTERPRET=1``) on the CPU; ``triton-gdn-sm90``, the Gluon decode and spec decode for sm_90
(``gdn_decode_sm90``) named to the dispatcher, so it is held to the matrix whatever the dispatcher prefers.

Activations reach the kernels in the cell's dtype, the pool in its own (float32, bfloat16, float16),
updated in place; o is written into a poisoned buffer (an element never written is NaN) of the
activation dtype, rounded to nearest even by the kernel in both places (its bf16 rounding goes
through the bits, so the interpreter's truncating conversion plays no part). Rounding model
``bf16-operands``: on the chunked op the kernels' dot operands are bf16 where that model rounds them; on
the other ops (where the model is ``exact``) fp32 arithmetic, one rounding per store.
"""
from __future__ import annotations

from conformance import paths
from conformance.backends.triton_kernels import _gpu_available, _interpret_available, _sm90_available
from conformance.cells import activation
from conformance.registry import INTERPRET_ENV, Backend, register
from conformance.torch_arrays import to_numpy, to_torch

OPS = ("recurrent", "chunked", "decode", "spec_decode")
# The interpreter on 2 shared CPU cores (2026-12-01, loaded): 1 to 4 s of tracing a kernel's first call, then
# 1e-6 to 6e-6 s per unit of tokens * heads * K^2 (every token a few dozen [K, V] array operations, each jit
# call several ms). The budget admits every ci cell (the largest, 75M, took 100 s) and skips the longest full
# ones; the pytest matrix marks the cells expected past 30 s slow (7 ci recurrent cells of 8M and more). The
# chunked op (2026-12-02, loaded): 0.3 to 1 s per (64-token chunk, value head), its solve stage most of it (the
# interpreter's cost of a jit helper call); its work counts whole chunks, and its budget admits every ci cell
# (the largest, 88M, 58 s); the cells it expects past 30 s are those measured past 20 s, and a few of 10 to 15 s.
INTERPRET_COST = {"seconds_per_cell": 1.0, "seconds_per_work": 4e-6,
                  "work_budget": {"recurrent": 80_000_000, "decode": 80_000_000, "spec_decode": 80_000_000,
                                  "chunked": 100_000_000}}


class TritonGdnImpl:
    """The reference's ``decode``/``spec_decode``/``recurrent``/``chunked`` (NumPy form: the pool updated in
    place, o returned) over the GDN dispatcher (``optimized.gdn_dispatch``: the fastest launcher that serves
    the call, or the launcher ``kernel`` names), on ``device`` ("cpu": the interpreter, or "cuda")."""

    def __init__(self, device: str, kernel: str = "auto"):
        self.device, self.kernel = device, kernel

    def _t(self, x):
        return to_torch(x, self.device)

    def _call(self, fn, before: tuple, state, after: tuple, state_dtype: str, **kw):
        """``fn(*before, pool, *after, out=, **kw)`` on device copies; the pool copied back into ``state``."""
        from conformance.poison import poisoned

        if state.dtype.name != state_dtype:
            raise TypeError(f"state: expected dtype {state_dtype} (state_dtype), got {state.dtype.name}")
        q, v = before[0], before[2]
        pool = self._t(state)
        out = self._t(poisoned((q.shape[0],) + tuple(v.shape[1:]), q.dtype))
        fn(*map(self._t, before), pool, *map(self._t, after), out=out, kernel=self.kernel, **kw)
        state[...] = to_numpy(pool)
        return to_numpy(out)

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, *, state_dtype, **kw):
        from optimized import gdn_dispatch

        return self._call(gdn_dispatch.decode, (q, k, v, A_log, a, b, dt_bias), state, (state_indices,), state_dtype,
                          **kw)

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, state_dtype, **kw):
        from optimized import gdn_dispatch

        return self._call(gdn_dispatch.spec_decode, (q, k, v, A_log, a, b, dt_bias), state,
                          (spec_state_indices, num_accepted_tokens, cu_seqlens), state_dtype, **kw)

    def recurrent(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, state_dtype, **kw):
        from optimized import gdn_dispatch

        return self._call(gdn_dispatch.recurrent, (q, k, v, g, beta, cu_seqlens), state, (state_indices,),
                          state_dtype, **kw)

    def chunked(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, state_dtype, **kw):
        from optimized import gdn_dispatch

        return self._call(gdn_dispatch.chunked, (q, k, v, g, beta, cu_seqlens), state, (state_indices,), state_dtype,
                          **kw)


def _problem(name: str, cell) -> str | None:
    from optimized import launchers

    return launchers.module(name).problem(K=cell["K"], V=cell.get("V", cell["K"]), state_dtype=cell["state"],
                                          act=activation(cell), H=cell["H"], HV=cell["HV"])


def _supports(cell) -> str | None:
    """The reason of the first GDN launcher for the cell's op (``optimized.launchers``) when none serves it."""
    from optimized import launchers

    reasons = [_problem(name, cell) for name in launchers.serving("gdn", cell.op)]
    return None if None in reasons else reasons[0]


def _make(name: str, interpret: bool) -> Backend:
    def run(cell, inputs):
        from conformance.families import gdn

        return gdn.run_with(TritonGdnImpl("cpu" if interpret else "cuda"), cell, inputs)

    return register(Backend(
        name=name, ops={"gdn": OPS}, available=_interpret_available if interpret else _gpu_available, run=run,
        supports=_supports, rounding_models={"gdn": "bf16-operands"}, env=INTERPRET_ENV if interpret else {},
        timeout_s=1800.0 if interpret else 600.0, uses_gpu=not interpret, probe_call=interpret,
        path=paths.fixed("interpreter") if interpret else paths.on_gpu, **(INTERPRET_COST if interpret else {})))


_make("triton-gdn", interpret=False)
_make("triton-gdn-interpret", interpret=True)


def _run_sm90(cell, inputs):
    from conformance.families import gdn

    return gdn.run_with(TritonGdnImpl("cuda", kernel="triton-gdn-sm90"), cell, inputs)


register(Backend(
    name="triton-gdn-sm90", ops={"gdn": ("decode", "spec_decode")}, available=_sm90_available, run=_run_sm90,
    supports=lambda cell: _problem("triton-gdn-sm90", cell), rounding_models={"gdn": "bf16-operands"},
    timeout_s=600.0, uses_gpu=True, path=paths.fixed("sm_90")))
