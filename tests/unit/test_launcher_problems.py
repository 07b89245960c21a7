"""One protocol per launcher (``optimized.launchers``): each module in ``LAUNCHERS`` exports ``problem(...)``
(why it cannot serve a request, or None) with its family's keywords, ``ENTRY_POINTS`` and ``compile_specs()``;
the backends and the dispatchers ask it, the kernels' limits are stated once, and no Triton or Gluon kernel of
``optimized/triton`` is left out of the ahead-of-time compile check."""
import importlib
import inspect
import pkgutil
import re

import pytest
import triton

import optimized.triton
from conformance import registry
from conformance.backends import triton_kernels
from conformance.cells import make_cell
from optimized import cpu, launchers, tq_dispatch
from optimized.triton import tq_cache, tq_decode_sm90


@pytest.mark.parametrize("name", list(launchers.LAUNCHERS))
def test_every_launcher_exports_problem_entry_points_and_compile_specs(name):
    module = launchers.module(name)
    family = launchers.LAUNCHERS[name].family
    params = inspect.signature(module.problem).parameters
    assert list(params) == list(launchers.PROBLEM_KEYWORDS[family])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert module.ENTRY_POINTS and all(callable(fn) for fn in module.ENTRY_POINTS.values())
    assert all(spec.fn.fn.__module__.startswith("optimized.triton.") for spec in module.compile_specs())


def _jit_functions() -> dict:
    """Every Triton and Gluon jit function defined in a module of optimized/triton: qualified name -> object."""
    found = {}
    for info in pkgutil.iter_modules(optimized.triton.__path__):
        module = importlib.import_module(f"optimized.triton.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.KernelInterface) and obj.fn.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_triton_kernel_is_compiled_by_the_compile_check():
    """A jit function is covered when a launcher's compile spec names it, or a covered one calls it: a kernel
    added to optimized/triton without a spec (or a launcher left out of LAUNCHERS) fails here."""
    from optimized.triton.compile_check import kernels

    jitted = _jit_functions()
    covered = {id(spec.fn) for spec in kernels()}
    grew = True
    while grew:
        sources = "\n".join(inspect.getsource(obj.fn) for obj in jitted.values() if id(obj) in covered)
        called = {id(obj) for qual, obj in jitted.items() if re.search(rf"\b{qual.rsplit('.', 1)[1]}\(", sources)}
        grew = not called <= covered
        covered |= called
    left_out = sorted(qual for qual, obj in jitted.items() if id(obj) not in covered)
    assert not left_out, f"jit functions no launcher's compile_specs() compiles: {left_out}"
    assert len(jitted) > 20


def test_the_dispatchers_take_their_kernels_from_the_table():
    from optimized import gdn_dispatch

    assert tq_dispatch.KERNELS == ("triton-sm90", "flydsl-gfx950", "triton-grouped", "triton-split")
    assert gdn_dispatch.kernels("decode") == ("triton-gdn-sm90", "triton-gdn")
    assert gdn_dispatch.kernels("spec_decode") == ("triton-gdn-sm90", "triton-gdn")
    assert gdn_dispatch.kernels("chunked") == ("triton-gdn-chunked",)


def test_head_sizes_are_stated_once():
    assert tq_decode_sm90.HEAD_SIZES is tq_cache.HEAD_SIZES
    assert not hasattr(tq_dispatch, "HEAD_SIZES") and not hasattr(triton_kernels, "LUT_PRESETS")
    assert not hasattr(tq_dispatch, "LAUNCHERS") and not hasattr(triton_kernels, "LAUNCHERS")


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
