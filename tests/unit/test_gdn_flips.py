"""The o bound of a 16-bit pool on the cells whose state is rounded several times before a later token
reads it (``gdn.o-16bit-pool``'s per-event flips, ``conformance.families.gdn.flips``), and its 16-bit-output
form against the oracle's rounded o (``gdn.output-rounding``): the reference passes, a kernel that reads o
from the stored state fails."""
from __future__ import annotations

import math

import numpy as np
import pytest

from conformance import families
from conformance.cells import activation
from conformance.families.gdn.flips import Flips, bennett, flip_weights
from conformance.families.gdn.matrix import cell_of
from conformance.memo import Memo
from conformance.numerics import to_activation
from conformance.testing import PLANTED, verdict_of
from reference.gdn import numpy_ref

gdn = families.get("gdn")
STORED = PLANTED["gdn.o-from-stored-state"]


def _several_roundings(cell) -> bool:
    """A 16-bit-pool token-op cell in which some sequence's state is rounded and then read by a later token."""
    if not STORED.applies(cell):
        return False
    if cell.op == "spec_decode":
        return max(cell["drafts"]) > 1
    if cell.op == "decode":
        return cell.get("steps", 1) > 1
    return max(cell["lens"]) > cell["interval"]


def _o(verdict):
    return next(c for c in verdict.comparisons if c.name == "o")


@pytest.mark.parametrize("op", ["spec_decode", "recurrent", "decode"])
def test_the_stored_state_read_fails_cells_of_several_roundings_that_the_reference_passes(op):
    cells = [c for c in gdn.cells("ci") if c.op == op and _several_roundings(c)]
    caught = []
    for cell in cells:
        memo, inputs = Memo(), gdn.make_inputs(cell)
        control = verdict_of(numpy_ref, cell, "exact", memo, inputs)
        assert control.status == "pass", f"{cell.id}: {control.reason}"
        if not _o(verdict_of(STORED.plant(numpy_ref), cell, "exact", memo, inputs)).passed:
            caught.append(cell.id)
            if op != "spec_decode":
                break
    assert caught, f"no ci {op} cell of several roundings catches {STORED.name} ({len(cells)} tried)"
    if op == "spec_decode":               # every draft reads the state its predecessor stored
        assert len(caught) == len(cells), sorted(set(c.id for c in cells) - set(caught))


def test_a_single_rounding_has_no_flip_term_and_a_chain_of_calls_has_one():
    one = cell_of("decode", dict(state="bfloat16", heads=(2, 4), KV=(32, 32), N=2, decay="weak",
                                 slots="shuffled", qk="unit", act="float32"))
    assert flip_weights(one, gdn.make_inputs(one)).tail(8.0) == 0.0
    chain = cell_of("decode", dict(state="bfloat16", heads=(2, 4), KV=(32, 32), N=2, decay="weak",
                                   slots="shuffled", qk="unit", act="float32", steps=4))
    flips = flip_weights(chain, gdn.make_inputs(chain))
    assert 0.0 < flips.mean <= flips.tail(8.0)
    assert flips.tail(8.0) < flips.tail(12.0)            # a rarer event, a larger bound


def test_the_chernoff_tails_hold_their_probability_on_sampled_flips():
    rng = np.random.default_rng(0)
    p, w = rng.uniform(0, 0.02, 500), rng.uniform(0.1, 1.0, 500)
    lam = 3.0                                            # exceeded with probability <= exp(-4.5) ~ 1.1%
    sums = (rng.random((20000, p.size)) < p) @ w
    assert np.mean(sums >= Flips(p, w, float(p @ w)).tail(lam)) <= math.exp(-lam ** 2 / 2)
    terms = rng.random((20000, 200)) * (rng.random((20000, 200)) < 0.05)     # in [0, 1], mean 0.025 each
    assert np.mean(terms.sum(axis=1) >= bennett(200 * 0.025, 1.0, lam)) <= math.exp(-lam ** 2 / 2)


class _OutputIn:
    """``impl`` whose ops return o rounded to ``act`` (gating unchanged)."""

    def __init__(self, act, impl=numpy_ref):
        self.act, self.impl = act, impl

    def __getattr__(self, name):
        fn = getattr(self.impl, name)
        if name == "gating":
            return fn
        return lambda *args, **kw: to_activation(fn(*args, **kw), self.act)


@pytest.mark.parametrize("act", ["bfloat16", "float16"])
def test_a_16bit_o_is_held_to_the_rounded_oracle_where_the_stored_state_read_fails(act):
    cells = [c for c in gdn.cells("ci") if STORED.applies(c) and activation(c) == act and c.op == "decode"]
    caught = []
    for cell in cells:
        memo, inputs = Memo(), gdn.make_inputs(cell)
        control = verdict_of(_OutputIn(act), cell, "exact", memo, inputs)
        assert control.status == "pass", f"{cell.id}: {control.reason}"
        assert "gdn.output-rounding" in _o(control).tolerance.terms
        if not _o(verdict_of(_OutputIn(act, STORED.plant(numpy_ref)), cell, "exact", memo, inputs)).passed:
            caught.append(cell.id)
    assert caught, f"no ci decode cell with o in {act} catches {STORED.name} ({len(cells)} tried)"
