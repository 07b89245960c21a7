"""GDN planted bugs of kinds shipped in serving kernels, one for each class of cell that exposes it
(``PLANTED``, joined to ``planted.PLANTED`` in the family's ``__init__``): a count clamped, an index
held in 16 bits, a softplus without its threshold, a float32 parameter read as 16-bit."""
from __future__ import annotations

import numpy as np

from conformance.planting import PlantedBug, Wrapped

ACCEPTED_CLAMP = 4          # a kernel written for at most 3 speculative tokens (4 state columns)


def _accepted_clamped(impl):
    """spec_decode resumes from column min(accepted, 4) - 1: the count is clamped to 4."""
    def spec_decode(*args, **kw):
        acc = np.minimum(np.asarray(args[9]), ACCEPTED_CLAMP).astype(np.asarray(args[9]).dtype)
        return impl.spec_decode(*args[:9], acc, *args[10:], **kw)
    return Wrapped(impl, spec_decode=spec_decode)


def _gates_unthresholded(A_log, a, b, dt_bias):
    """g, beta float32 with softplus as log1p(exp(x)) in float32 for every x: inf past x = 88.7."""
    x = np.asarray(a, np.float32) + np.asarray(dt_bias, np.float32)
    with np.errstate(over="ignore"):
        g = -np.exp(np.asarray(A_log, np.float32)) * np.log1p(np.exp(x))
    return g.astype(np.float32), (1.0 / (1.0 + np.exp(-np.asarray(b, np.float32)))).astype(np.float32)


def _softplus_unthresholded(impl):
    """gating, and decode (computed as its gating, then the recurrent op with a write-back every token), take
    softplus without its threshold: log1p(exp(x)) overflows to inf past x = 88.7, so g = -inf there."""
    def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, **kw):
        g, beta = _gates_unthresholded(A_log, a, b, dt_bias)
        g = np.maximum(g, np.finfo(np.float32).min)     # -inf as the recurrent op takes it: exp(g) = 0
        cu = np.arange(len(state_indices) + 1, dtype=np.int32)
        return impl.recurrent(q, k, v, g, beta, cu, state, state_indices, **kw, state_write_interval=1)
    return Wrapped(impl, gating=_gates_unthresholded, **({"decode": decode} if hasattr(impl, "recurrent") else {}))


def _wrapped_16(idx):
    """Slot indices as 16-bit arithmetic leaves them: a valid slot modulo 2^16, padding (-1) kept."""
    idx = np.asarray(idx)
    return np.where(idx >= 0, idx & 0xFFFF, idx).astype(idx.dtype)


def _slot_index_16bit(impl):
    """Every pool op computes the slot it reads and writes in 16 bits: slot s becomes s mod 65536."""
    def varlen(name):
        fn = getattr(impl, name)
        return lambda *args, **kw: fn(*args[:7], _wrapped_16(args[7]), *args[8:], **kw)

    def decode(*args, **kw):
        return impl.decode(*args[:8], _wrapped_16(args[8]), *args[9:], **kw)

    def spec_decode(*args, **kw):
        return impl.spec_decode(*args[:8], _wrapped_16(args[8]), *args[9:], **kw)
    ops = {"decode": decode, "spec_decode": spec_decode, **{n: varlen(n) for n in ("recurrent", "chunked")}}
    return Wrapped(impl, **{name: fn for name, fn in ops.items() if hasattr(impl, name)})


def _misread(dt_bias, a):
    """A float32 ``dt_bias`` [HV] read as the first HV elements of its buffer in a's 16-bit dtype (little
    endian: the low half of element 0, then its high half, ...); a bit pattern that is NaN or Inf there is
    read as 0 (the reference refuses non-finite arguments). Other dtypes come back unchanged."""
    dt_bias, act = np.asarray(dt_bias), np.asarray(a).dtype
    if dt_bias.dtype != np.float32 or act.itemsize != 2:
        return dt_bias
    read = np.ascontiguousarray(dt_bias).view(np.uint16)[: dt_bias.shape[0]].view(act)
    return np.where(np.isfinite(read.astype(np.float32)), read, act.type(0)).astype(act)


def _dt_bias_read_as_act(impl):
    """gating, decode and spec_decode read a float32 dt_bias as if it were in the activations' dtype."""
    def gating(A_log, a, b, dt_bias, **kw):
        return impl.gating(A_log, a, b, _misread(dt_bias, a), **kw)

    def gated(name):
        fn = getattr(impl, name)
        return lambda *args, **kw: fn(*args[:6], _misread(args[6], args[4]), *args[7:], **kw)
    return Wrapped(impl, gating=gating, decode=gated("decode"), spec_decode=gated("spec_decode"))


def _gdn(name, doc, applies, plant):
    return PlantedBug(f"gdn.{name}", "gdn", doc, applies, plant)


PLANTED = (
    _gdn("accepted-clamped", "spec_decode clamps the accepted count to 4 before choosing the slot it resumes from",
         lambda c: c.op == "spec_decode", _accepted_clamped),
    _gdn("softplus-unthresholded", "gating's softplus is log1p(exp(x)) without the threshold 20 (inf past 88.7)",
         lambda c: c.op in ("gating", "decode"), _softplus_unthresholded),
    _gdn("slot-index-16bit", "the pool ops hold slot indices in 16 bits: slot s is read and written at s mod 65536",
         lambda c: c.op != "gating", _slot_index_16bit),
    _gdn("dt-bias-read-as-act", "a float32 dt_bias beside 16-bit activations is read as if in their dtype",
         lambda c: c.op in ("gating", "decode", "spec_decode"), _dt_bias_read_as_act),
)
