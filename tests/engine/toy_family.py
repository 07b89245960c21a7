"""A toy family built on the lab's public API only (named in KERNEL_LAB_FAMILY_MODULES by the engine
tests): op "scale" multiplies x [n] float32 by a factor; cells are cheap. The runner tests run it
through ``kernel-lab conform`` with the backends of ``tests.engine.toy_backends``."""
import numpy as np

from conformance.cells import make_cell
from conformance.compare import Tolerance, ToleranceSpec, compare, verdict
from conformance.numerics import U32, bf16_round
from conformance.rounding import RoundingModel, by_name

FAMILY = "toy"
OPS = ("scale",)


class _Exact:
    @staticmethod
    def scale(x, factor):
        return x * np.float32(factor)


class _Bf16X:
    @staticmethod
    def scale(x, factor):
        return bf16_round(x) * np.float32(factor)


MODELS = by_name((RoundingModel("exact", "one fp32 rounding of the product", _Exact, differs_on=None),
                  RoundingModel("bf16-x", "x rounded to bf16 first, then one fp32 rounding of the product", _Bf16X,
                                differs_on=("scale",))))
ROUNDING_MODELS = {m.name: m.words for m in MODELS.values()}

PRODUCT = ToleranceSpec("toy.product", "rtol 2 u32", "x * factor rounded once to fp32: at most u32 relative; "
                        "2 u32 leaves room for a fused multiply; the toy-wrong backend (adds 1e-3) fails it", ())
PRODUCT_TOL = Tolerance(0.0, 2 * U32, f"{PRODUCT.name}: {PRODUCT.argument}")
SPECS = (PRODUCT,)
PLANTED = ()


def cells(tier):
    """n = 8, 9, ...; factor cycles 1, 2, 3; 3 cells in smoke, 12 in ci, 20 in full."""
    n = {"smoke": 3, "ci": 12, "full": 20}[tier]
    return [make_cell(FAMILY, "scale", n=8 + i, factor=float(i % 3 + 1), seed=0) for i in range(n)]


def make_inputs(cell):
    """x float32 [n] from the cell's rng, and the factor."""
    return {"x": cell.rng().standard_normal(cell["n"]).astype(np.float32), "factor": cell["factor"]}


def run_with(impl, cell, inputs):
    """impl.scale(x, factor) -> y float32 [n]."""
    return {"y": np.asarray(impl.scale(inputs["x"], inputs["factor"]), np.float32)}


def check(cell, rounding_model, inputs, outputs, memo=None):
    """y against the float64 product of x ("exact") or of bf16(x) ("bf16-x"), memoised when a memo is given."""
    if rounding_model not in ROUNDING_MODELS:
        raise ValueError(f"rounding_model: expected one of {sorted(ROUNDING_MODELS)}, got {rounding_model!r}")

    def oracle():
        x = bf16_round(inputs["x"]) if rounding_model == "bf16-x" else inputs["x"]
        return x.astype(np.float64) * inputs["factor"]

    expected = oracle() if memo is None else memo.get(cell, inputs, ("toy-product", rounding_model), oracle)
    return verdict([compare("y", outputs["y"], expected, PRODUCT_TOL)])
