"""Property-based test of the FlyDSL decode launcher's argument checks (hypothesis): bad arguments
on top of a valid cell of the turboquant family are refused before any GPU work, with a ValueError
or TypeError whose message starts with the argument's name, and the NumPy reference refuses the
same argument the same way. (Valid calls need a gfx950 GPU; test_flydsl_emulation covers the math.)"""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from conformance.cells import make_cell  # noqa: E402
from conformance.families import turboquant as family  # noqa: E402
from conformance.torch_arrays import to_torch  # noqa: E402
from optimized.flydsl import launcher, plan  # noqa: E402
from reference.turboquant import numpy_ref  # noqa: E402

MUTATIONS = {
    "query NaN": ("query", lambda x: np.where(np.arange(x["query"].size).reshape(x["query"].shape) == 0, np.nan,
                                              x["query"]).astype(x["query"].dtype)),
    "query as a list": ("query", lambda x: x["query"].tolist()),
    "scale NaN": ("scale", lambda x: float("nan")),
    "scale a string": ("scale", lambda x: "0.1"),
    "rotation Inf": ("rotation", lambda x: np.where(np.eye(128) > 0, np.inf, x["rotation"]).astype(np.float32)),
    "block_table out of range": ("block_table", lambda x: np.full_like(x["block_table"], x["kv_cache"].shape[0])),
    "seq_lens past the table": ("seq_lens", lambda x: [10**6] * len(x["seq_lens"])),
    "seq_lens of floats": ("seq_lens", lambda x: [1.5] * len(x["seq_lens"])),
}


def _tensor(v):
    return to_torch(v) if isinstance(v, np.ndarray) else v


@settings(max_examples=6, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bad_arguments_are_refused_by_name_before_the_kernel(data):
    cell = make_cell(family.FAMILY, "decode", preset=plan.PRESET, layout=plan.LAYOUT, Hk=data.draw(st.integers(1, 2)),
                     G=data.draw(st.sampled_from(plan.GROUPS)), bs=data.draw(st.sampled_from(plan.BLOCK_SIZES)),
                     lens=tuple(data.draw(st.lists(st.integers(1, 20), min_size=1, max_size=2))),
                     rotation="random", sinks=False, D=128, seed=data.draw(st.integers(0, 1000)))
    x = family.make_inputs(cell)
    label = data.draw(st.sampled_from(sorted(MUTATIONS)))
    name, make = MUTATIONS[label]
    value = make(x)
    args = dict(query=x["query"], kv_cache=x["kv_cache"], block_table=x["block_table"], seq_lens=x["seq_lens"],
                preset=x["preset"], layout=x["layout"], rotation=x["rotation"], scale=x["scale"])
    with pytest.raises((ValueError, TypeError)) as refused:
        launcher.decode(**{k: _tensor(v) for k, v in {**args, name: value}.items()})
    assert re.match(rf"{name}\b", str(refused.value)), f"{label}: {refused.value!r} does not name {name}"
    with pytest.raises(type(refused.value)) as by_reference:
        numpy_ref.decode(**{**args, name: value})
    assert re.match(rf"{name}\b", str(by_reference.value)), f"{label}: the reference's {by_reference.value!r}"
