"""The GDN family (gated delta rule): ops gating, recurrent, chunked, decode, spec_decode.

matrix (axes, validity, corners, tiers), inputs (``make_inputs``), driver (``run_with``), oracle
(the float64 oracles and ``ROUNDING_MODELS``), terms (the sum of |terms| behind o and the state),
tolerances (each bound as data), check.
"""
from conformance.families.gdn.check import check
from conformance.families.gdn.driver import run_with
from conformance.families.gdn.inputs import make_inputs
from conformance.families.gdn.matrix import CHUNK, FAMILY, OPS, cells
from conformance.families.gdn.oracle import ROUNDING_MODELS

__all__ = ["CHUNK", "FAMILY", "OPS", "ROUNDING_MODELS", "cells", "check", "make_inputs", "run_with"]
