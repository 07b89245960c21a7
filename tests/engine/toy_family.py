"""A toy family for engine tests: op "scale" multiplies x by a factor; cells are cheap."""
from conformance.cells import make_cell
from conformance.compare import Tolerance, compare, verdict

FAMILY = "toy"
OPS = ("scale",)
ROUNDING_MODELS = {"exact": "one fp32 rounding of the product"}


def cells(tier):
    n = {"smoke": 3, "ci": 12, "full": 20}[tier]
    return [make_cell("toy", "scale", n=8 + i, factor=float(i % 3 + 1), seed=0) for i in range(n)]


def make_inputs(cell):
    return {"x": cell.rng().standard_normal(cell["n"]).astype("float32"), "factor": cell["factor"]}


def run_with(impl, cell, inputs):
    return {"y": impl.scale(inputs["x"], inputs["factor"])}


def check(cell, rounding_model, inputs, outputs, memo=None):
    expected = inputs["x"].astype("float64") * inputs["factor"]
    return verdict([compare("y", outputs["y"], expected,
                            Tolerance(0.0, 2.0**-23, "one fp32 rounding of a product"))])
