"""Every planted bug (``conformance.testing.PLANTED``) fails at least one ci cell through its
family's check, under every rounding model of its family (``MODELS``), while the same reference
without the bug passes that cell. The bugs are planted into the NumPy reference that computes
like the model (the record's ``reference``); the backend tests plant the same bugs into the kernels.
A model runs on the ops where it differs from "exact" (``differs_on``; elsewhere the "exact" runs
cover it), skips the bugs it never reads (``unread``) and expects the ones below its tolerance to
pass (``undetectable``: strict xfails)."""
from __future__ import annotations

import pytest

from conformance import families
from conformance.memo import Memo
from conformance.testing import PLANTED, first_failing_cell, reference_impl, verdict_of


def _cases():
    for name, bug in PLANTED.items():
        family = families.get(bug.family)
        for model in family.MODELS.values():
            if name in model.unread:
                continue
            cells = [c for c in family.cells("ci") if bug.applies(c) and model.runs_on(c.op) and model.defined_for(c)]
            if cells:
                yield pytest.param(name, model.name, cells, id=f"{name}@{model.name}",
                                   marks=[pytest.mark.xfail(strict=True, reason=f"below the {model.name} tolerance")]
                                   if name in model.undetectable else [])


@pytest.mark.parametrize("name,model,cells", list(_cases()))
def test_planted_bug_fails_a_ci_cell_that_the_reference_passes(name, model, cells):
    bug = PLANTED[name]
    base = reference_impl(bug.family, model)
    memo = Memo()
    found = first_failing_cell(bug.plant(base), bug.family, model, cells, memo)
    assert found is not None, f"no {bug.family} ci cell catches {name} under {model} ({len(cells)} tried)"
    control = verdict_of(base, found, model, memo)
    assert control.status == "pass", f"{found.id} fails without the bug too: {control.reason}"


@pytest.mark.parametrize("family", sorted(families.families()))
def test_every_tolerance_names_planted_bugs_of_its_family_and_every_bug_is_named(family):
    module = families.get(family)
    named = {bug for spec in module.SPECS for bug in spec.caught}
    mine = {bug.name for bug in module.PLANTED}
    assert named <= mine, f"tolerances name unknown bugs: {sorted(named - mine)}"
    assert mine <= named, f"planted bugs no tolerance names: {sorted(mine - named)}"


@pytest.mark.parametrize("family", sorted(families.families()))
def test_every_model_record_names_known_bugs_and_its_own_family_terms(family):
    module = families.get(family)
    mine = {bug.name for bug in module.PLANTED}
    for model in module.MODELS.values():
        assert model.unread | model.undetectable <= mine, model.name
        assert {t for terms in model.terms.values() for t in terms} <= set(module.SPECS), model.name
        assert model.differs_on is None or set(model.differs_on) <= set(module.OPS), model.name
    assert module.ROUNDING_MODELS == {m.name: m.words for m in module.MODELS.values()}
