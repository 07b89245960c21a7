"""The decode dispatch picks the fastest kernel that serves the device and the request, and an explicit
choice that cannot serve it fails naming why; the sm_90 launcher refuses what it cannot read before
launching. On a machine without a GPU the sm_90 and gfx950 kernels are never chosen."""
import numpy as np
import pytest
import torch

from optimized import tq_dispatch
from optimized.triton.tq_decode_sm90 import decode_sm90, device_problem, dtype_problem, shape_problem
from reference.turboquant.presets import preset as preset_of

from tests.unit.tq_triton_helpers import DEVICE, make_case, t

P = "turboquant_4bit_nc"
pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="checks what a machine without a GPU chooses")


@pytest.fixture(scope="module")
def case():
    q, cache, bt, lens, rot, _ = make_case(P, "soa", D=128, G=2, lens=(5, 20))
    return dict(q=t(q), cache=t(cache), bt=t(bt), lens=t(lens), rot=t(rot))


def test_without_a_gpu_the_portable_kernels_are_chosen(case):
    assert tq_dispatch.choose(case["q"], case["cache"], preset=P, layout="soa") == "triton-grouped"
    aos = torch.zeros(4, 16, 2, case["cache"].shape[3], dtype=torch.uint8)
    assert tq_dispatch.choose(case["q"], aos, preset=P, layout="aos") == "triton-split"
    for kernel in ("triton-sm90", "flydsl-gfx950"):
        assert tq_dispatch.problem(kernel, case["q"], case["cache"], preset=P, layout="soa")


def test_auto_decode_matches_the_chosen_kernel(case):
    from optimized.triton.tq_decode_grouped import decode_grouped

    kw = dict(preset=P, layout="soa", rotation=case["rot"])
    args = (case["q"], case["cache"], case["bt"], case["lens"])
    want = decode_grouped(*args, **kw).numpy()
    np.testing.assert_array_equal(tq_dispatch.decode(*args, **kw).numpy(), want)
    as_lists = (case["q"], case["cache"], case["bt"].tolist(), case["lens"].tolist())
    np.testing.assert_array_equal(tq_dispatch.decode(*as_lists, **kw).numpy(), want)


def test_dispatch_names_a_query_or_cache_that_is_not_a_tensor(case):
    with pytest.raises(TypeError, match="query must be a torch tensor"):
        tq_dispatch.choose(case["q"].tolist(), case["cache"], preset=P, layout="soa")
    with pytest.raises(TypeError, match="kv_cache must have dtype"):
        tq_dispatch.choose(case["q"], case["cache"].float(), preset=P, layout="soa")


@pytest.mark.parametrize("kernel,match", [("triton-sm90", "Gluon kernels do not run|NVIDIA GPU"),
                                          ("flydsl-gfx950", "flydsl kernel supports|FlyDSL|ROCm|gfx950"),
                                          ("no-such-kernel", "kernel must be")])
def test_an_explicit_kernel_that_cannot_serve_fails_naming_why(case, kernel, match):
    with pytest.raises(ValueError, match=match):
        tq_dispatch.decode(case["q"], case["cache"], case["bt"], case["lens"], preset=P, layout="soa",
                           rotation=case["rot"], kernel=kernel)


def test_sm90_decode_takes_16_bit_queries_only():
    assert dtype_problem(torch.bfloat16) is None and dtype_problem(torch.float16) is None
    assert "bfloat16 or float16 queries, got float32" in dtype_problem(torch.float32)


def test_sm90_launcher_refuses_what_it_cannot_read(case):
    kw = dict(preset=P, layout="soa", rotation=case["rot"])
    args = (case["q"], case["cache"], case["bt"], case["lens"])
    with pytest.raises(ValueError, match="block_n"):
        decode_sm90(*args, block_n=48, **kw)
    with pytest.raises(ValueError, match="stages must be an integer"):
        decode_sm90(*args, stages=0, **kw)
    with pytest.raises(ValueError, match="fp16_values must be one of"):
        decode_sm90(*args, fp16_values="bf16", **kw)
    with pytest.raises(ValueError, match="kv_cache: the sm_90 decode reads turboquant_4bit_nc"):
        decode_sm90(*args, preset=P, layout="aos", rotation=case["rot"])
    with pytest.raises(ValueError, match="kv_cache: Gluon kernels do not run|kv_cache: the sm_90 decode needs an NVIDIA"):
        decode_sm90(*args, **kw)
    with pytest.raises(ValueError, match="kv_cache: Gluon kernels do not run|kv_cache: the sm_90 decode needs an NVIDIA"):
        decode_sm90(case["q"], case["cache"], case["bt"].tolist(), case["lens"].tolist(), **kw)
    with pytest.raises(ValueError, match="block_table must have shape"):
        decode_sm90(case["q"], case["cache"], case["bt"][:1], case["lens"], **kw)
    assert shape_problem(P, "soa", 128, 16) is None
    assert "head sizes" in shape_problem(P, "soa", 96, 16)
    assert "block size" in shape_problem(P, "soa", 128, 4)
    assert "turboquant_4bit_nc" in shape_problem("turboquant_k8v4", "soa", 128, 16)
    assert device_problem(torch.device("cpu"))


def test_no_kernel_serves_head_size_96_and_the_error_says_why_for_each():
    p = preset_of(P)
    q = torch.zeros(1, 4, 96, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, 2, p.slot_size(96), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"no TurboQuant decode serves.*'triton-split': 'the Triton kernels support "
                                         r"head sizes \(64, 128, 256\)"):
        tq_dispatch.choose(q, cache, preset=P, layout="soa")
