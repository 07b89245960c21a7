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


def _gdn(name, doc, applies, plant):
    return PlantedBug(f"gdn.{name}", "gdn", doc, applies, plant)


PLANTED = (
    _gdn("accepted-clamped", "spec_decode clamps the accepted count to 4 before choosing the slot it resumes from",
         lambda c: c.op == "spec_decode", _accepted_clamped),
)
