"""The GDN kernel to run for a device and a call: the fastest conformant launcher that serves it.

The kernels of an op are the GDN launchers of ``optimized.launchers.LAUNCHERS`` with an entry point for it,
fastest first: today ``triton-gdn-sm90`` (``gdn_decode_sm90``: decode and spec_decode on sm_90, K = V = 128),
``triton-gdn`` (``gdn_recurrent``: decode, spec_decode, recurrent) and ``triton-gdn-chunked``
(``gdn_chunked``: chunked). ``decode(..., kernel="auto")`` (and ``spec_decode``,
``recurrent``, ``chunked``) runs the first whose ``problem`` says None for the call's head sizes, head counts,
dtypes and device; naming a kernel runs that one or raises ValueError saying why it cannot serve the call.
The arguments and results are those of the launchers (``gdn_recurrent.decode`` ...).
"""
from __future__ import annotations

from optimized import launchers

OPS = ("decode", "spec_decode", "recurrent", "chunked")


def kernels(op: str) -> tuple[str, ...]:
    """The launchers that run ``op`` (one of ``OPS``), fastest first."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return launchers.serving("gdn", op)


def problem(kernel: str, op: str, q, v, state) -> str | None:
    """Why ``kernel`` cannot run ``op`` on these tensors (``q [T, H, K]``, ``v [T, HV, V]``, ``state [S, HV, K,
    V]`` torch tensors, else TypeError/ValueError naming the argument), or None: its launcher's ``problem``."""
    from optimized.triton.checks import FLOAT_DTYPES, check_tensor
    from optimized.triton.gdn_recurrent import SUPPORTED_POOL_DTYPES

    if kernel not in kernels(op):
        raise ValueError(f"kernel must be 'auto' or one of {kernels(op)} for {op}, got {kernel!r}")
    check_tensor("q", q, (None, None, None), FLOAT_DTYPES)
    check_tensor("v", v, (None, None, None), FLOAT_DTYPES)
    check_tensor("state", state, (None, None, None, None), SUPPORTED_POOL_DTYPES)
    return launchers.module(kernel).problem(
        K=q.shape[2], V=v.shape[2], state_dtype=str(state.dtype).removeprefix("torch."),
        act=str(q.dtype).removeprefix("torch."), H=q.shape[1], HV=v.shape[1], device=state.device)


def choose(op: str, q, v, state) -> str:
    """The fastest kernel that runs ``op`` on these tensors; ValueError listing each one's reason when none does."""
    reasons = {}
    for kernel in kernels(op):
        why = problem(kernel, op, q, v, state)
        if why is None:
            return kernel
        reasons[kernel] = why
    raise ValueError(f"no GDN {op} kernel serves this call: {reasons}")


def _run(op: str, args: tuple, state, kernel: str, kw: dict):
    q, v = args[0], args[2]
    if kernel == "auto":
        kernel = choose(op, q, v, state)
    else:
        why = problem(kernel, op, q, v, state)
        if why:
            raise ValueError(f"kernel {kernel!r} cannot serve this {op}: {why}")
    return launchers.entry(kernel, op)(*args, **kw)


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, kernel: str = "auto", **kw):
    """``gdn_recurrent.decode``'s arguments and result, run by ``kernel`` (``"auto"``: ``choose``)."""
    return _run("decode", (q, k, v, A_log, a, b, dt_bias, state, state_indices), state, kernel, kw)


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, *,
                kernel: str = "auto", **kw):
    """``gdn_recurrent.spec_decode``'s arguments and result, run by ``kernel`` (``"auto"``: ``choose``)."""
    return _run("spec_decode", (q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                                cu_seqlens), state, kernel, kw)


def recurrent(q, k, v, g, beta, cu_seqlens, state, state_indices, *, kernel: str = "auto", **kw):
    """``gdn_recurrent.recurrent``'s arguments and result, run by ``kernel`` (``"auto"``: ``choose``)."""
    return _run("recurrent", (q, k, v, g, beta, cu_seqlens, state, state_indices), state, kernel, kw)


def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, kernel: str = "auto", **kw):
    """``gdn_chunked.chunked``'s arguments and result, run by ``kernel`` (``"auto"``: ``choose``)."""
    return _run("chunked", (q, k, v, g, beta, cu_seqlens, state, state_indices), state, kernel, kw)
