"""The TurboQuant family (4-bit KV cache): ops store, decode and store_decode.

matrix (axes, validity, corners, tiers), inputs (``make_inputs``), driver (``run_with``), oracle
(the float64 oracles and ``ROUNDING_MODELS``), tolerances (each bound as data), check.
"""
from conformance.families.turboquant.check import check
from conformance.families.turboquant.driver import run_with
from conformance.families.turboquant.inputs import make_inputs
from conformance.families.turboquant.matrix import FAMILY, OPS, PRESET_NAMES, cells
from conformance.families.turboquant.oracle import ROUNDING_MODELS

__all__ = ["FAMILY", "OPS", "PRESET_NAMES", "ROUNDING_MODELS", "cells", "check", "make_inputs", "run_with"]
