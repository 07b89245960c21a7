"""The TurboQuant family (4-bit KV cache): ops store, decode and store_decode.

matrix (axes, validity, corners, tiers), inputs (``make_inputs``), driver (``run_with``), oracle
(the float64 oracles), models (the rounding models, one record each: ``MODELS``, ``ROUNDING_MODELS``),
tolerances (each bound as data: ``SPECS``), check, planted and planted_field (the family's planted bugs: ``PLANTED``), refusals (the bad inputs every
implementation refuses: ``REFUSALS``, and the ``POOL`` a refused call leaves alone), captured (its inputs from a file: ``CAPTURED``).
"""
from conformance.families.turboquant import captured as CAPTURED
from conformance.families.turboquant.check import check
from conformance.families.turboquant.driver import run_with
from conformance.families.turboquant.inputs import make_inputs
from conformance.families.turboquant.matrix import FAMILY, OPS, PRESET_NAMES, cells
from conformance.families.turboquant.models import MODELS, ROUNDING_MODELS
from conformance.families.turboquant import planted, planted_field
from conformance.families.turboquant.refusals import POOL, REFUSALS
from conformance.families.turboquant.tolerances import SPECS

PLANTED = planted.PLANTED + planted_field.PLANTED

__all__ = ["CAPTURED", "FAMILY", "MODELS", "OPS", "PLANTED", "POOL", "PRESET_NAMES", "REFUSALS", "ROUNDING_MODELS",
           "SPECS", "cells", "check", "make_inputs", "run_with"]
