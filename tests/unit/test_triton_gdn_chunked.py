"""The Triton GDN chunked prefill (``optimized.triton.gdn_chunked``) through the interpreter on a CPU:

- planted bugs (``conformance.testing.PLANTED``) in the kernels' wrapper fail a small ci chunked cell each;
- valid calls (hypothesis draws small chunked cells: sequences across chunk ends, padding slots, two-call
  splits) pass the family's check under the backend's rounding model with ``out`` and the pool as views into
  buffers of guard bytes, and nothing outside the views changes;
- bad input is refused before launch by a ValueError/TypeError whose message starts with the argument's
  name, nothing written;
- each prep kernel, with the output read out in the state pass or after it, passes the check on a small cell;
  the "tiles" prep kernel's variants that share work between value heads, compute the readout operands or
  batch the solve's diagonal blocks give the default's result bit for bit, those that round elsewhere (the
  solve by rows among them) pass the check;
- the stages run one after another give what ``chunked`` gives, the output read out in the state pass or
  after it;
- the segmented state pass (``segment_chunks``) passes the ``bf16-operands-segmented`` check (its oracle at the
  kernel's segment length) on guarded views, with each pool dtype, a padding slot, a two-call split and the
  output read out after the state pass; planted bugs fail it under that model; a sequence of one segment gives
  the serial path's bits; bad ``segment_chunks`` and maps configurations are refused by name.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from conformance import registry
from conformance.backends.triton_gdn import TritonGdnImpl
from conformance.cells import make_cell
from conformance.families import gdn
from conformance.families.gdn import oracle as gdn_oracle
from conformance.run.runner import cell_work
from conformance.testing import PLANTED, first_failing_cell, reference_impl, verdict_of
from conformance.torch_arrays import to_numpy, to_torch
from optimized.triton import gdn_chunked as C
from tests.unit.test_triton_gdn import FEW, _guarded, _names, _nan, _t
from tests.unit.tq_triton_helpers import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter runs on machines without a GPU")
MODEL = registry.get("triton-gdn-interpret").rounding_model("gdn")

BUGS = ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store", "gdn.state-read-transposed",
        "gdn.padding-slot-written", "gdn.fp16-read-as-bf16", "gdn.qk-norm-in-input-dtype")


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bugs_fail_a_small_ci_chunked_cell(bug):
    planted = PLANTED[bug]
    backend = registry.get("triton-gdn-interpret")
    # the smallest cells where the bug planted into the model's NumPy reference fails (where it can be caught)
    reference = planted.plant(reference_impl("gdn", MODEL))
    candidates = sorted((c for c in gdn.cells("ci") if c.op == "chunked" and planted.applies(c)
                         and backend.skip_reason(c) is None), key=cell_work)
    cells = list(itertools.islice((c for c in candidates if verdict_of(reference, c, MODEL).status == "fail"), 3))
    assert cells, f"no small ci cell for {bug}"
    found = first_failing_cell(planted.plant(TritonGdnImpl("cpu")), "gdn", MODEL, cells)
    assert found is not None, f"{bug} passed {[c.id for c in cells]}"


def _cell(draw):
    H = draw(st.sampled_from([1, 2]))
    lens = tuple(draw(st.lists(st.sampled_from([1, 5, 63, 64, 70]), min_size=1, max_size=2)))
    return make_cell("gdn", "chunked", state=draw(st.sampled_from(["float32", "bfloat16", "float16"])), H=H,
                     HV=H * draw(st.sampled_from([1, 2])), K=draw(st.sampled_from([16, 32])), lens=lens,
                     decay=draw(st.sampled_from(["strong", "weak", "zero"])),
                     slots=draw(st.sampled_from(["shuffled", "padded"])), qk="unit",
                     split=draw(st.sampled_from([None, 37])) if max(lens) > 37 else None,
                     act=draw(st.sampled_from(["bfloat16", "float16", "float32"])), seed=draw(st.integers(0, 1000)))


def _views(x):
    S, HV, Kd, V = x["state"].shape
    pool_buf, pool, pool_owned = _guarded((S, HV, Kd, V), (HV * Kd * V + 8, Kd * V, V, 1),
                                          to_torch(x["state"]).dtype)
    pool.copy_(_t(x["state"]))
    T = x["q"].shape[0]
    out_buf, out, out_owned = _guarded((T, HV, V), (HV * V + 4, V, 1), to_torch(x["q"]).dtype)
    return pool_buf, pool, pool_owned, out_buf, out, out_owned


class _Guarded(TritonGdnImpl):
    """The backend's chunked op on guarded views: the pool is ``pool`` (a view in ``pool_buf``), every call's
    ``out`` a view into a guarded buffer; ``strays`` counts bytes written outside the views."""

    def __init__(self, pool):
        super().__init__("cpu")
        self.pool, self.strays = pool, 0

    def chunked(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, state_dtype, **kw):
        T, HV, V = q.shape[0], v.shape[1], v.shape[2]
        out_buf, out, owned = _guarded((T, HV, V), (HV * V + 4, V, 1), to_torch(q).dtype)
        before = out_buf.clone()
        C.chunked(*map(self._t, (q, k, v, g, beta, cu_seqlens)), self.pool, self._t(state_indices), out=out, **kw)
        self.strays += int(((out_buf != before) & ~owned).sum())
        state[...] = to_numpy(self.pool)
        return to_numpy(out)


def _checked_in_guarded_views(cell, model):
    """The kernels on ``cell``'s inputs with out and the pool in guarded views: the family check's verdict
    under ``model``, once no byte around out or around the pool's slots was written."""
    x = gdn.make_inputs(cell)
    pool_buf, pool, pool_owned, *_ = _views(x)
    before = pool_buf.clone()
    impl = _Guarded(pool)
    got = gdn.run_with(impl, cell, {**x, "state": x["state"].copy()})
    assert impl.strays == 0, f"{impl.strays} bytes written around out"
    stray = ((pool_buf != before) & ~pool_owned).nonzero().flatten()
    assert stray.numel() == 0, f"{stray.numel()} bytes written around the pool (first at {stray[:5].tolist()})"
    return gdn.check(cell, model, x, got)


@FEW
@given(data=st.data())
def test_valid_calls_pass_the_family_check_and_write_only_their_views(data):
    cell = _cell(data.draw)
    verdict = _checked_in_guarded_views(cell, MODEL)
    assert verdict.status == "pass", verdict.reason


@pytest.mark.parametrize("prep", sorted(C.PREP_KERNELS))
@pytest.mark.parametrize("readout", [True, False])
def test_each_prep_kernel_and_readout_mode_passes_the_family_check(monkeypatch, prep, readout):
    cell = make_cell("gdn", "chunked", state="bfloat16", H=1, HV=2, K=32, lens=(70, 5, 130), decay="weak",
                     slots="padded", qk="unit", split=None, act="bfloat16")
    x = gdn.make_inputs(cell)
    monkeypatch.setattr(C, "stages", functools.partial(C.stages, prep=prep, readout=readout))
    got = gdn.run_with(TritonGdnImpl("cpu"), cell, {**x, "state": x["state"].copy()})
    verdict = gdn.check(cell, MODEL, x, got)
    assert verdict.status == "pass", verdict.reason


PLAIN_TILES = dict(prep="tiles", prep_heads=1, prep_readout=False, prep_form="blocks", prep_warps=4)


def _staged_run(args, pool, indices, **kw):
    """``stages`` launched one by one: (out, stage names)."""
    out, launches = C.stages(*args, pool, indices, **kw)
    for _, launch in launches:
        launch()
    return out, [name for name, _ in launches]


@pytest.mark.parametrize("variant", [{**PLAIN_TILES, "prep_heads": 2}, {**PLAIN_TILES, "prep_readout": True},
                                     {**PLAIN_TILES, "prep_form": "batched"}, {}],
                         ids=["heads2", "readout", "batched", "defaults"])
def test_the_tiles_prep_variants_that_share_work_give_what_the_plain_tiles_kernel_gives_bit_for_bit(variant):
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="bfloat16", H=2, HV=4, K=16, lens=(70, 5), decay="weak",
                                  slots="padded", qk="unit", split=None, act="bfloat16"))
    args = [_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pools = [_t(x["state"]).clone() for _ in range(2)]
    plain, names = _staged_run(args, pools[0], _t(x["state_indices"]), **PLAIN_TILES)
    assert names == ["prep", "readout", "state"]
    out, names = _staged_run(args, pools[1], _t(x["state_indices"]), **variant)
    assert names == (["prep", "state"] if variant.get("prep_readout", C.PREP_READOUT) else ["prep", "readout", "state"])
    assert torch.equal(plain, out) and torch.equal(pools[0], pools[1])


@pytest.mark.parametrize("variant", [dict(prep_norm="rcp"), dict(prep_heads=2, prep_readout=True, prep_norm="rcp")])
def test_the_tiles_prep_variants_that_round_differently_pass_the_family_check(monkeypatch, variant):
    cell = make_cell("gdn", "chunked", state="bfloat16", H=1, HV=2, K=32, lens=(70, 5, 130), decay="weak",
                     slots="padded", qk="unit", split=None, act="bfloat16")
    x = gdn.make_inputs(cell)
    monkeypatch.setattr(C, "stages", functools.partial(C.stages, prep="tiles", **variant))
    got = gdn.run_with(TritonGdnImpl("cpu"), cell, {**x, "state": x["state"].copy()})
    verdict = gdn.check(cell, MODEL, x, got)
    assert verdict.status == "pass", verdict.reason


def test_the_stages_one_by_one_give_what_chunked_gives_with_and_without_the_readout_in_the_state_pass():
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="bfloat16", H=1, HV=2, K=16, lens=(70, 5), decay="weak",
                                  slots="padded", qk="unit", split=None, act="bfloat16"))
    args = [_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pools = [_t(x["state"]).clone() for _ in range(4)]
    whole = C.chunked(*args, pools[0], _t(x["state_indices"]))
    for kw, pool, names in ((dict(readout=True), pools[1], ["prep", "state"] if C.PREP_READOUT else
                             ["prep", "readout", "state"]),
                            (dict(readout=True, prep_readout=False), pools[2], ["prep", "readout", "state"]),
                            (dict(readout=False), pools[3], ["prep", "state", "output"])):
        out, got = _staged_run(args, pool, _t(x["state_indices"]), **kw)
        assert got == names
        assert torch.equal(whole, out) and torch.equal(pools[0], pool), kw


# ---------------------------------------------------------------- bad input

BAD = {
    "q NaN": _nan("q"),
    "beta NaN": _nan("beta"),
    "g in bf16": ("g", lambda x, p, o: _t(x["g"]).to(torch.bfloat16)),
    "v of another dtype": ("v", lambda x, p, o: _t(x["v"]).to(torch.float64)),
    "cu_seqlens not ending at T": ("cu_seqlens", lambda x, p, o: [0] * len(x["cu_seqlens"])),
    "cu_seqlens int64": ("cu_seqlens", lambda x, p, o: _t(x["cu_seqlens"]).long()),
    "state_indices out of range": ("state_indices", lambda x, p, o: [10 ** 6] * len(x["state_indices"])),
    "state_indices repeated": ("state_indices", lambda x, p, o: [0] * len(x["state_indices"])),
    "chunk_size 32": ("chunk_size", lambda x, p, o: 32),
    "state_write_interval 100": ("state_write_interval", lambda x, p, o: 100),
    "scale NaN": ("scale", lambda x, p, o: float("nan")),
    "out of another shape": ("out", lambda x, p, o: torch.empty(o.shape[0], o.shape[1], o.shape[2] + 1, dtype=o.dtype)),
    "state a transposed view": ("state", lambda x, p, o: p.transpose(-1, -2)),
}


@pytest.mark.parametrize("label", sorted(BAD))
def test_bad_chunked_input_is_refused_by_name_and_nothing_is_written(label):
    cell = make_cell("gdn", "chunked", state="float16", H=1, HV=2, K=16, lens=(2, 70), decay="weak", slots="padded",
                     qk="unit", split=None, act="bfloat16")
    x = gdn.make_inputs(cell)
    pool_buf, pool, _, out_buf, out, _ = _views(x)
    name, make = BAD[label]
    value = make(x, pool, out)
    args = {n: _t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state_indices")}
    kw = dict(scale=x["scale"], l2norm_eps=x["l2norm_eps"], out=out)
    if name in args:
        args[name] = value
    elif name == "out":
        kw["out"] = value
    elif name != "state":
        kw[name] = value
    before = (pool_buf.clone(), out_buf.clone())
    with pytest.raises((ValueError, TypeError)) as refused:
        C.chunked(*(args[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")), value if name == "state" else pool,
                  args["state_indices"], **kw)
    assert _names(refused.value, name), f"{label}: {refused.value!r} does not name {name}"
    assert torch.equal(pool_buf, before[0]) and torch.equal(out_buf, before[1]), "a refused call wrote"


def test_an_out_overlapping_the_pool_is_refused_by_name():
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="bfloat16", H=1, HV=2, K=16, lens=(2, 70), decay="weak",
                                  slots="shuffled", qk="unit", split=None, act="bfloat16"))
    T, HV, V = x["v"].shape
    pool = torch.zeros(-(-T * V // (16 * V)) + 1, HV, 16, V, dtype=torch.bfloat16)
    out = pool.view(-1)[: T * HV * V].view(T, HV, V)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"^out overlaps state"):
        C.chunked(*(_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens")), pool, _t(x["state_indices"]),
                  out=out)
    assert torch.equal(pool, before)


def test_state_pass_and_prep_configuration_is_checked_by_name():
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="float32", H=1, HV=1, K=16, lens=(3,), decay="weak",
                                  slots="shuffled", qk="unit", split=None, act="bfloat16"))
    args = [_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "state_indices")]
    with pytest.raises(ValueError, match=r"^state_block_v"):
        C.stages(*args, state_block_v=48)
    for name, bad in (("prep_heads", dict(prep_heads=2)), ("prep_heads", dict(prep_heads=True)),
                      ("prep_norm", dict(prep_norm="approx")),
                      ("prep_form", dict(prep_form="columns")), ("prep_registers", dict(prep_registers=16)),
                      ("prep_readout", dict(prep_readout=True, readout=False)),
                      ("prep", dict(prep="blocks", prep_norm="rcp")),
                      ("prep", dict(prep="blocks", prep_form="batched"))):
        with pytest.raises(ValueError, match=rf"^{name}:"):
            C.stages(*args, **bad)


def test_problem_and_stage_bytes():
    assert C.problem(K=128, V=128, state_dtype="bfloat16", act="bfloat16", H=16, HV=32) is None
    assert C.problem(K=64, V=64, state_dtype="float64", act="bfloat16").startswith("state: dtype float64")
    # G fp32, W, U, k exp(G_last - G) bf16 per token and value head; q exp(G) and a row of tril(q k^T) bf16, or
    # v_new bf16 per token and h bf16 per chunk; written once and read once
    assert C.stage_bytes(64, 1, 1, 16, 16, readout=True) == 2 * 64 * (4 + 32 + 32 + 32 + 32 + 128)
    assert C.stage_bytes(64, 1, 1, 16, 16, readout=False) == 2 * (64 * (4 + 32 + 32 + 32 + 32) + 16 * 16 * 2)
    assert np.isclose(C.stage_bytes(8192, 128, 32, 128, 128, readout=True) / 1e6, 606.1, atol=0.1)
    assert np.isclose(C.stage_bytes(8192, 128, 32, 128, 128, readout=False) / 1e6, 807.4, atol=0.1)


# ---------------------------------------------------------------- the segmented state pass

SEGMENTED = "bf16-operands-segmented"
SEGMENT_CELL = dict(H=2, HV=4, K=32, lens=(200, 1, 64, 130, 384), decay="weak", slots="padded", qk="unit",
                    act="bfloat16")


@pytest.mark.parametrize("segment_chunks,state,split,readout", [
    (1, "float32", None, True), (2, "bfloat16", None, True), (3, "float16", None, True),
    (2, "bfloat16", 150, True), (2, "float32", None, False)])
def test_the_segmented_state_pass_passes_its_models_check_and_writes_only_its_views(monkeypatch, segment_chunks,
                                                                                     state, split, readout):
    # the model's oracle at the kernel's segment length (the model is declared at gdn_oracle.SEGMENT_CHUNKS)
    monkeypatch.setattr(gdn_oracle, "SEGMENT_CHUNKS", segment_chunks)
    monkeypatch.setattr(C, "stages", functools.partial(C.stages, segment_chunks=segment_chunks, readout=readout))
    cell = make_cell("gdn", "chunked", state=state, split=split, **SEGMENT_CELL)
    verdict = _checked_in_guarded_views(cell, SEGMENTED)
    assert verdict.status == "pass", verdict.reason
    assert "gdn.bf16-operands-segmented" in verdict.comparisons[1].tolerance.terms


@pytest.mark.parametrize("bug", ("gdn.head-mapping-tiled", "gdn.chunk-update-skipped", "gdn.truncating-store"))
def test_planted_bugs_fail_a_segmented_cell_under_the_segmented_model(monkeypatch, bug):
    monkeypatch.setattr(C, "stages", functools.partial(C.stages, segment_chunks=gdn_oracle.SEGMENT_CHUNKS))
    planted = PLANTED[bug]
    cell = make_cell("gdn", "chunked", state="bfloat16", split=None, **SEGMENT_CELL)
    assert planted.applies(cell)
    clean = verdict_of(TritonGdnImpl("cpu"), cell, SEGMENTED)
    assert clean.status == "pass", clean.reason
    assert verdict_of(planted.plant(TritonGdnImpl("cpu")), cell, SEGMENTED).status == "fail"


def test_sequences_of_one_segment_give_the_serial_paths_bits_and_the_stages_come_in_order():
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="bfloat16", split=None, **SEGMENT_CELL))
    args = [_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens")]
    pools = [_t(x["state"]).clone() for _ in range(3)]
    idx = _t(x["state_indices"])
    serial, _ = _staged_run(args, pools[0], idx)
    whole, names = _staged_run(args, pools[1], idx, segment_chunks=6)       # every sequence one segment
    assert names == ["prep", "maps", "merge", "state"]
    assert torch.equal(serial, whole) and torch.equal(pools[0], pools[1])
    out, _ = _staged_run(args, pools[2], idx, segment_chunks=3)             # 200 and 384 tokens split
    cu = x["cu_seqlens"]
    lengths = np.diff(cu)
    for n, slot in enumerate(x["state_indices"]):
        rows = slice(cu[n], cu[n + 1])
        same = torch.equal(out[rows], serial[rows]) and (slot < 0 or torch.equal(pools[2][slot], pools[0][slot]))
        assert same == (slot < 0 or lengths[n] <= 3 * 64), (n, lengths[n], slot)


def test_bad_segment_configuration_is_refused_by_name():
    x = gdn.make_inputs(make_cell("gdn", "chunked", state="float32", H=1, HV=1, K=16, lens=(3,), decay="weak",
                                  slots="shuffled", qk="unit", split=None, act="bfloat16"))
    args = [_t(x[n]) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "state_indices")]
    for bad in (0, -2, True, 1.5, "2"):
        with pytest.raises(ValueError, match=r"^segment_chunks:"):
            C.stages(*args, segment_chunks=bad)
    for bad in (dict(maps_block=48), dict(maps_warps=3), dict(maps_stages=0)):
        with pytest.raises(ValueError, match=r"^maps_block, maps_warps, maps_stages:"):
            C.stages(*args, segment_chunks=2, **bad)
