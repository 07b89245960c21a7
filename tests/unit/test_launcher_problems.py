"""One verifier per launcher: each exports ``problem(...)`` (why it cannot serve a request, or None),
the backends and the dispatch ask it, and the kernels' limits are stated once."""
import inspect

import pytest

from conformance import registry
from conformance.backends import triton_kernels
from conformance.cells import make_cell
from optimized import cpu, tq_dispatch
from optimized.triton import tq_cache, tq_decode_sm90

KEYWORDS = ["preset", "layout", "D", "block_size", "G", "sinks", "act", "device"]


@pytest.mark.parametrize("module", sorted(set(tq_dispatch.LAUNCHERS.values()) | set(triton_kernels.LAUNCHERS.values())
                                          | {"optimized.triton.tq_store"}))
def test_every_turboquant_launcher_exports_problem_with_the_request_keywords(module):
    problem = __import__(module, fromlist=["problem"]).problem
    assert list(inspect.signature(problem).parameters) == KEYWORDS


def test_head_sizes_are_stated_once():
    assert tq_decode_sm90.HEAD_SIZES is tq_cache.HEAD_SIZES
    assert not hasattr(tq_dispatch, "HEAD_SIZES") and not hasattr(triton_kernels, "LUT_PRESETS")


def _tq_cell(**kw):
    params = dict(preset="turboquant_4bit_nc", layout="soa", Hk=2, G=4, bs=16, lens=[5], rotation="hadamard",
                  sinks=False, D=128, range="unit", act="bfloat16", seed=0)
    return make_cell("turboquant", "decode", **{**params, **kw})


@pytest.mark.parametrize("backend,cell,says", [
    ("triton-interpret", _tq_cell(D=96), "head sizes (64, 128, 256)"),
    ("triton-grouped-interpret", _tq_cell(layout="aos"), "grouped decode reads turboquant_4bit_nc"),
    ("triton-unified-interpret", _tq_cell(layout="aos"), "SoA layout only"),
    ("flydsl-emulated", _tq_cell(D=64), "head size"),
])
def test_a_backend_skips_with_its_launchers_reason(backend, cell, says):
    assert says in registry.get(backend).skip_reason(cell)


def test_the_cpu_limits_come_from_the_extension():
    built, why = cpu.extension_status()
    if not built:
        pytest.skip(why)
    limits = cpu.head_limits()
    top, step = limits["chunk_max_head"], limits["chunk_head_step"]
    assert cpu.problem("chunk_prefill", top, top) is None
    assert "multiples of" in cpu.problem("chunk_prefill", top + step, top)
    assert "up to" in cpu.problem("decode", limits["decode_max_head"] + 1, 64)
    cell = make_cell("gdn", "chunked", state="float32", H=1, HV=1, K=top + step, V=64, lens=[3], decay="weak",
                     slots="shuffled", qk="unit", split="none", act="float32", seed=0)
    assert "multiples of" in registry.get("cpu-scalar").skip_reason(cell)
