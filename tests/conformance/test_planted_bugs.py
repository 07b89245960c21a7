"""Every planted bug (``conformance.testing.PLANTED``) fails at least one ci cell through its
family's check, under every rounding model the family's kernels use, while the same reference
without the bug passes that cell. The bugs are planted into the NumPy reference that computes
like the model (``reference_impl``); the backend tests plant the same bugs into the kernels."""
from __future__ import annotations

import pytest

from conformance import families
from conformance.families.gdn import tolerances as gdn_tolerances
from conformance.families.gdn.oracle import defined_for
from conformance.families.turboquant import tolerances as tq_tolerances
from conformance.memo import Memo
from conformance.testing import PLANTED, first_failing_cell, reference_impl, verdict_of

# The models a planted bug runs under, per family, and the ops where a model differs from "exact"
# (elsewhere its oracle and tolerance are the exact ones, which the "exact" runs cover).
MODELS = {"gdn": {"exact": None, "bf16-operands": ("chunked",), "bf16-gemm": ("chunked",), "fla-chunk": ("chunked",),
                 "vllm-cpu": None},
          "turboquant": {"exact": None, "act-mma": ("decode", "store_decode"), "act-sdpa": ("decode",)}}
# act-sdpa (torch-sdpa) attends over the unquantized cache: bugs in reading the quantized cache or
# rotating the query have nothing to act on there
UNREAD = {"act-sdpa": {"turboquant.norm-correction-twice", "turboquant.query-rotated-by-transpose",
                       "turboquant.soa-read-as-aos"}}
# torch-eager's bf16 GEMM results carry ~u_bf16 noise, the size of a truncating store's error and of
# reading fp16 activations as bf16 (a bf16-gemm kernel rounds its operands to bf16 whatever they come in)
UNDETECTABLE = {("gdn.truncating-store", "bf16-gemm"), ("gdn.fp16-read-as-bf16", "bf16-gemm")}
SPECS = {"gdn": gdn_tolerances.SPECS, "turboquant": tq_tolerances.SPECS}


def _cases():
    for name, bug in PLANTED.items():
        for model, ops in MODELS[bug.family].items():
            if name in UNREAD.get(model, ()):
                continue
            cells = [c for c in families.get(bug.family).cells("ci") if bug.applies(c) and (ops is None or c.op in ops)
                     and (bug.family != "gdn" or defined_for(c, model))]
            if cells:
                yield pytest.param(name, model, cells, id=f"{name}@{model}",
                                   marks=[pytest.mark.xfail(strict=True, reason="below the bf16-gemm tolerance")]
                                   if (name, model) in UNDETECTABLE else [])


@pytest.mark.parametrize("name,model,cells", list(_cases()))
def test_planted_bug_fails_a_ci_cell_that_the_reference_passes(name, model, cells):
    bug = PLANTED[name]
    base = reference_impl(bug.family, model)
    memo = Memo()
    found = first_failing_cell(bug.plant(base), bug.family, model, cells, memo)
    assert found is not None, f"no {bug.family} ci cell catches {name} under {model} ({len(cells)} tried)"
    control = verdict_of(base, found, model, memo)
    assert control.status == "pass", f"{found.id} fails without the bug too: {control.reason}"


@pytest.mark.parametrize("family", sorted(SPECS))
def test_every_tolerance_names_planted_bugs_of_its_family_and_every_bug_is_named(family):
    named = {bug for spec in SPECS[family] for bug in spec.caught}
    mine = {name for name, bug in PLANTED.items() if bug.family == family}
    assert named <= mine, f"tolerances name unknown bugs: {sorted(named - mine)}"
    assert mine <= named, f"planted bugs no tolerance names: {sorted(mine - named)}"
