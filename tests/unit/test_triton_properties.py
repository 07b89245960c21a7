"""Property-based tests of the Triton TurboQuant launchers (store, split-KV decode, grouped decode,
unified attention), through the interpreter on a CPU: hypothesis draws small cells of the
turboquant family and bad arguments.

- Valid: the family's check (oracle and tolerance of the ``exact`` rounding model, the store's
  field-by-field comparison) passes; every output is a view into a larger buffer of guard bytes
  (decode ``out``; the store's ``kv_cache`` with padding between blocks) and nothing outside the
  view changes; a decode leaves the cache as it was.
- Invalid: ValueError or TypeError whose message starts with the argument's name, nothing written;
  where the NumPy reference takes the argument, it raises the same exception type naming it.
Interpreter calls take ~0.2 to 1 s: a few examples each by default, more under ``-m slow``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conformance.cells import make_cell
from conformance.families import turboquant as family
from conformance.numerics import ACTIVATIONS
from conformance.torch_arrays import to_numpy, to_torch
from optimized.triton.tq_decode_grouped import decode_grouped
from optimized.triton.tq_decode_split import decode_split
from optimized.triton.tq_store import store
from optimized.triton.tq_unified import unified_attention
from reference.turboquant import numpy_ref

from tests.unit.tq_triton_helpers import DEVICE

GUARD = 0xA5
LEAD, TAIL = 4, 12  # guard bytes before / elements after each output view (LEAD keeps 4-byte alignment)
DECODERS = ("split", "grouped", "unified")
FEW = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck),
               max_examples=5)
INVALID = settings(FEW, max_examples=16)


def _family_check(cell, inputs: dict, outputs: dict):
    """The turboquant family's verdict under the ``exact`` rounding model (the interpreter's)."""
    return family.check(cell, "exact", inputs, outputs)


def _t(x):
    return to_torch(x, DEVICE)


def _guarded(n: int, dtype) -> torch.Tensor:
    buf = torch.empty(LEAD + n * torch.empty((), dtype=dtype).element_size() + TAIL * 4, dtype=torch.uint8,
                      device=DEVICE)
    buf.fill_(GUARD)
    return buf


def _assert_unchanged_outside(before: torch.Tensor, after: torch.Tensor, owned: torch.Tensor) -> None:
    stray = ((before != after) & ~owned).nonzero().flatten()
    assert stray.numel() == 0, f"{stray.numel()} bytes written outside the outputs (first at {stray[:5].tolist()})"


# ---------------------------------------------------------------- decode cells

@st.composite
def decode_calls(draw, launcher: str):
    """A valid call: the family's cell and inputs, the launcher's keyword arguments, a guarded out."""
    preset = "turboquant_4bit_nc" if launcher == "grouped" else draw(st.sampled_from(family.PRESET_NAMES))
    layout = "soa" if launcher != "split" else draw(st.sampled_from(["aos", "soa"]))
    rotation = "none" if preset == "turboquant_k8v4" else draw(st.sampled_from(["hadamard", "random"]))
    lens = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=2)))
    cell = make_cell(family.FAMILY, "decode", preset=preset, layout=layout, Hk=draw(st.integers(1, 2)),
                     G=draw(st.integers(1, 3)), bs=16, lens=lens, rotation=rotation, sinks=draw(st.booleans()),
                     D=64, act=draw(st.sampled_from(list(ACTIVATIONS))), seed=draw(st.integers(0, 10_000)))
    x = family.make_inputs(cell)
    B, Hq, D = x["query"].shape
    buf = _guarded(B * Hq * D, torch.float32)
    out = buf[LEAD:LEAD + B * Hq * D * 4].view(torch.float32).view(B, Hq, D)
    kw = dict(preset=preset, layout=layout, rotation=_t(x["rotation"]), scale=x["scale"], sinks=_t(x["sinks"]),
              out=out)
    if launcher != "unified":
        kw["num_kv_splits"] = draw(st.sampled_from([None, 1, 2, 3]))
    tables = (x["block_table"].tolist(), x["seq_lens"].tolist()) if draw(st.booleans()) else (
        _t(x["block_table"]), _t(x["seq_lens"]))
    args = dict(query=_t(x["query"]), kv_cache=_t(x["kv_cache"]), block_table=tables[0], seq_lens=tables[1])
    return dict(launcher=launcher, cell=cell, inputs=x, args=args, kw=kw, buf=buf)


def _decode(call):
    a, kw = call["args"], call["kw"]
    if call["launcher"] == "unified":
        B = a["query"].shape[0] if isinstance(a["query"], torch.Tensor) else len(a["query"])
        qsl = kw.pop("query_start_loc", torch.arange(B + 1, dtype=torch.int32, device=DEVICE))
        mql = kw.pop("max_query_len", 1)
        return unified_attention(a["query"], a["kv_cache"], a["block_table"], qsl, a["seq_lens"], mql, **kw)
    fn = decode_split if call["launcher"] == "split" else decode_grouped
    return fn(a["query"], a["kv_cache"], a["block_table"], a["seq_lens"], **kw)


@pytest.mark.parametrize("launcher", DECODERS)
@FEW
@given(data=st.data())
def test_valid_decodes_pass_the_family_check_and_stay_inside_out(launcher, data):
    call = data.draw(decode_calls(launcher))
    before, cache_before = call["buf"].clone(), call["args"]["kv_cache"].clone()
    out = call["kw"]["out"]
    assert _decode(call) is out
    v = _family_check(call["cell"], call["inputs"], {"out": out.cpu().numpy()})
    assert v.status == "pass", v.reason
    owned = torch.zeros(before.numel(), dtype=torch.bool, device=DEVICE)
    owned[LEAD:LEAD + out.numel() * 4] = True
    _assert_unchanged_outside(before, call["buf"], owned)
    assert torch.equal(call["args"]["kv_cache"], cache_before), "a decode wrote into kv_cache"


# ---------------------------------------------------------------- store cells

@st.composite
def store_calls(draw):
    preset = draw(st.sampled_from(family.PRESET_NAMES))
    layout = draw(st.sampled_from(["aos", "soa"]))
    rotation = "none" if preset == "turboquant_k8v4" else draw(st.sampled_from(["hadamard", "random"]))
    cell = make_cell(family.FAMILY, "store", preset=preset, layout=layout, Hk=draw(st.integers(1, 2)), bs=16,
                     ntok=draw(st.integers(1, 4)), rotation=rotation, D=64, act=draw(st.sampled_from(list(ACTIVATIONS))),
                     seed=draw(st.integers(0, 10_000)))
    x = family.make_inputs(cell)
    nb, bs, Hk, slot = x["kv_cache"].shape
    block_stride = bs * Hk * slot + 2 * draw(st.integers(0, 3))  # even padding between blocks
    buf = _guarded(nb * block_stride, torch.uint8)
    cache = buf[LEAD:].as_strided((nb, bs, Hk, slot), (block_stride, Hk * slot, slot, 1))
    cache.copy_(_t(x["kv_cache"]))
    slots = x["slot_mapping"].tolist() if draw(st.booleans()) else _t(x["slot_mapping"])
    args = dict(kv_cache=cache, key=_t(x["key"]), value=_t(x["value"]), slot_mapping=slots)
    return dict(cell=cell, inputs=x, args=args, kw=dict(preset=preset, layout=layout, rotation=_t(x["rotation"])),
                buf=buf, block_stride=block_stride)


def _store(call):
    a = call["args"]
    return store(a["kv_cache"], a["key"], a["value"], a["slot_mapping"], **call["kw"])


def _cache_bytes(call) -> torch.Tensor:
    """Mask of the buffer bytes the cache view covers."""
    nb, bs, Hk, slot = call["args"]["kv_cache"].shape
    owned = torch.zeros(call["buf"].numel(), dtype=torch.bool, device=DEVICE)
    for b in range(nb):
        start = LEAD + b * call["block_stride"]
        owned[start:start + bs * Hk * slot] = True
    return owned


@FEW
@given(call=store_calls())
def test_valid_stores_pass_the_family_check_and_stay_inside_the_cache(call):
    before = call["buf"].clone()
    _store(call)
    v = _family_check(call["cell"], call["inputs"], {"kv_cache": call["args"]["kv_cache"].cpu().numpy()})
    assert v.status == "pass", v.reason
    _assert_unchanged_outside(before, call["buf"], _cache_bytes(call))


# ---------------------------------------------------------------- invalid arguments

def _poison(name, value):
    def fn(call):
        x = call["args"].get(name, call["kw"].get(name)).clone()
        x.view(-1)[0] = value
        return x
    return name, fn


def _bad_out(fn):
    return "out", lambda call: fn(call["kw"]["out"])


def _strided(x):
    """``x`` as a view with stride 2 (its values interleaved with others): a kernel reading
    ``ptr + i`` would see the others, not the values the checks read through the strides."""
    return torch.stack([x, torch.full_like(x, 10**6)], dim=-1).reshape(-1)[::2]


def _overlapping(out):
    d = next(i for i, n in enumerate(out.shape) if n > 1)
    return out.as_strided(out.shape, tuple(0 if i == d else s for i, s in enumerate(out.stride())))


DECODE_SHARED = {  # the NumPy reference decode takes these arguments too
    "query NaN": _poison("query", float("nan")),
    "query as a list": ("query", lambda c: c["args"]["query"].tolist()),
    "scale NaN": ("scale", lambda c: float("nan")),
    "scale Inf": ("scale", lambda c: float("-inf")),
    "scale a string": ("scale", lambda c: "0.125"),
    "block_table out of range": ("block_table", lambda c: [[10**6] * len(r) for r in np.asarray(
        c["inputs"]["block_table"]).tolist()]),
    "seq_lens past the table": ("seq_lens", lambda c: [10**6] * len(c["inputs"]["seq_lens"])),
    "seq_lens of floats": ("seq_lens", lambda c: [1.5] * len(c["inputs"]["seq_lens"])),
}
DECODE_ONLY = {
    "out shape": _bad_out(lambda o: torch.zeros(o.shape[0], o.shape[1], o.shape[2] + 1, device=o.device)),
    "out dtype": _bad_out(lambda o: torch.zeros(o.shape, dtype=torch.float64, device=o.device)),
    "out rows strided": _bad_out(lambda o: torch.zeros(o.shape[:2] + (2 * o.shape[2],), device=o.device)[..., ::2]),
    "out overlaps itself": _bad_out(_overlapping),
    "out as a list": _bad_out(lambda o: o.tolist()),
    "seq_lens a strided view": ("seq_lens", lambda c: _strided(_t(c["inputs"]["seq_lens"]))),
}
SPLITS = {
    "num_kv_splits 0": ("num_kv_splits", lambda c: 0),
    "num_kv_splits too many": ("num_kv_splits", lambda c: 65),
    "num_kv_splits a float": ("num_kv_splits", lambda c: 1.5),
}
MUTATIONS = {
    "split": {**DECODE_SHARED, **DECODE_ONLY, **SPLITS},
    "grouped": {**DECODE_SHARED, **DECODE_ONLY, **SPLITS,
                "num_warps 3": ("num_warps", lambda c: 3), "num_stages 0": ("num_stages", lambda c: 0),
                "block_n 48": ("block_n", lambda c: 48)},
    "unified": {**DECODE_SHARED, **DECODE_ONLY,
                "max_query_len 0": ("max_query_len", lambda c: 0),
                "query_start_loc of floats": ("query_start_loc", lambda c: [0.5] * (len(c["inputs"]["seq_lens"]) + 1))},
}
REFERENCE_ARGS = ("query", "block_table", "seq_lens", "scale", "sinks", "rotation", "num_kv_splits")
LAUNCHER_ONLY = ("num_kv_splits too many", "seq_lens a strided view", "rotation a transposed view",
                 "slot_mapping a strided view")  # the reference has no split limit and reads through strides


def _names(exc: BaseException, name: str) -> bool:
    return re.match(rf"{re.escape(name)}\b", str(exc)) is not None


@pytest.mark.parametrize("launcher", DECODERS)
@INVALID
@given(data=st.data())
def test_invalid_decode_arguments_are_refused_by_name_and_nothing_is_written(launcher, data):
    call = data.draw(decode_calls(launcher))
    mutations = dict(MUTATIONS[launcher])
    if call["inputs"]["rotation"] is not None:
        mutations["rotation NaN"] = _poison("rotation", float("nan"))
        mutations["rotation a transposed view"] = ("rotation", lambda c: _t(c["inputs"]["rotation"]).T)
    if call["inputs"]["sinks"] is not None:
        mutations["sinks NaN"] = _poison("sinks", float("inf"))
    label = data.draw(st.sampled_from(sorted(mutations)))
    out = call["kw"]["out"]
    assume(out.numel() > 1 or label not in ("out rows strided", "out overlaps itself"))
    assume(len(call["inputs"]["seq_lens"]) > 1 or label != "seq_lens a strided view")  # one element: contiguous
    name, make = mutations[label]
    value = make(call)
    (call["args"] if name in call["args"] else call["kw"])[name] = value
    before, cache_before = call["buf"].clone(), call["args"]["kv_cache"].clone()
    with pytest.raises((ValueError, TypeError)) as refused:
        _decode(call)
    assert _names(refused.value, name), f"{label}: {refused.value!r} does not name {name}"
    assert torch.equal(call["buf"], before), "a refused call wrote into out or around it"
    assert torch.equal(call["args"]["kv_cache"], cache_before)
    if name not in REFERENCE_ARGS or label in LAUNCHER_ONLY:
        return
    x = dict(call["inputs"])
    ref_args = dict(query=x["query"], kv_cache=x["kv_cache"], block_table=x["block_table"], seq_lens=x["seq_lens"],
                    preset=x["preset"], layout=x["layout"], rotation=x["rotation"], scale=x["scale"],
                    sinks=x["sinks"])
    ref_args[name] = to_numpy(value) if isinstance(value, torch.Tensor) else value
    with pytest.raises(type(refused.value)) as by_reference:
        numpy_ref.decode(**ref_args)
    assert _names(by_reference.value, name), f"{label}: the reference's {by_reference.value!r} does not name {name}"


STORE_MUTATIONS = {
    "key NaN": _poison("key", float("nan")),
    "value as a list": ("value", lambda c: c["args"]["value"].tolist()),
    "slot_mapping out of range": ("slot_mapping", lambda c: [10**6] * len(c["inputs"]["slot_mapping"])),
    "slot_mapping of floats": ("slot_mapping", lambda c: [0.5] * len(c["inputs"]["slot_mapping"])),
    "kv_cache overlaps itself": ("kv_cache", lambda c: c["args"]["kv_cache"].as_strided(
        c["args"]["kv_cache"].shape, (0,) + c["args"]["kv_cache"].stride()[1:])),
    "kv_cache dtype": ("kv_cache", lambda c: c["args"]["kv_cache"].to(torch.int16)),
    "slot_mapping a strided view": ("slot_mapping", lambda c: _strided(_t(c["inputs"]["slot_mapping"]))),
}


@INVALID
@given(data=st.data())
def test_invalid_store_arguments_are_refused_by_name_and_nothing_is_written(data):
    call = data.draw(store_calls())
    mutations = dict(STORE_MUTATIONS)
    if call["inputs"]["rotation"] is not None:
        mutations["rotation NaN"] = _poison("rotation", float("nan"))
    label = data.draw(st.sampled_from(sorted(mutations)))
    name, make = mutations[label]
    assume(label != "kv_cache overlaps itself" or call["args"]["kv_cache"].shape[0] > 1)
    assume(label != "slot_mapping a strided view" or len(call["inputs"]["slot_mapping"]) > 1)
    value = make(call)
    (call["args"] if name in call["args"] else call["kw"])[name] = value
    before = call["buf"].clone()
    with pytest.raises((ValueError, TypeError)) as refused:
        _store(call)
    assert _names(refused.value, name), f"{label}: {refused.value!r} does not name {name}"
    assert torch.equal(call["buf"], before), "a refused store wrote into the cache or around it"
    if name == "kv_cache" or label in LAUNCHER_ONLY:  # the reference store writes a NumPy cache
        return
    x = call["inputs"]
    ref_args = dict(kv_cache=x["kv_cache"].copy(), key=x["key"], value=x["value"], slot_mapping=x["slot_mapping"],
                    preset=x["preset"], layout=x["layout"], rotation=x["rotation"])
    ref_args[name] = to_numpy(value) if isinstance(value, torch.Tensor) else value
    with pytest.raises(type(refused.value)) as by_reference:
        numpy_ref.store(**ref_args)
    assert _names(by_reference.value, name), f"{label}: the reference's {by_reference.value!r} does not name {name}"
