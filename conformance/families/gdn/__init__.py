"""The GDN family (gated delta rule): ops gating, recurrent, chunked, decode, spec_decode.

matrix (axes, validity, corners, tiers), inputs (``make_inputs``), driver (``run_with``), oracle
(the float64 oracles), models (the rounding models, one record each: ``MODELS``, ``ROUNDING_MODELS``),
terms (the sum of |terms| behind o and the state), tolerances (each bound as data: ``SPECS``), check,
planted and planted_field (the family's planted bugs: ``PLANTED``), refusals (the bad inputs every
implementation refuses: ``REFUSALS``, and the ``POOL`` a refused call leaves alone), captured (its inputs
from a file: ``CAPTURED``).
"""
from conformance.families.gdn import captured as CAPTURED
from conformance.families.gdn.check import check
from conformance.families.gdn.driver import run_with
from conformance.families.gdn.inputs import make_inputs
from conformance.families.gdn.matrix import CHUNK, FAMILY, OPS, cells
from conformance.families.gdn.models import MODELS, ROUNDING_MODELS
from conformance.families.gdn import planted, planted_field
from conformance.families.gdn.refusals import POOL, REFUSALS
from conformance.families.gdn.tolerances import SPECS

PLANTED = planted.PLANTED + planted_field.PLANTED

__all__ = ["CAPTURED", "CHUNK", "FAMILY", "MODELS", "OPS", "PLANTED", "POOL", "REFUSALS", "ROUNDING_MODELS", "SPECS",
           "cells", "check", "make_inputs", "run_with"]
