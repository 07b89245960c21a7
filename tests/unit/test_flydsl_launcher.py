"""The FlyDSL launcher refuses shapes the kernel does not support (before touching a GPU) and
caches compiled modules by shape."""
import pytest
import torch

from optimized.flydsl import launcher


def _args(G=8, bs=16, Hk=2, slot=134, B=1, M=2, dtype=torch.bfloat16):
    return (torch.zeros(B, Hk * G, 128, dtype=dtype), torch.zeros(4, bs, Hk, slot, dtype=torch.uint8),
            torch.zeros(B, M, dtype=torch.int32), torch.ones(B, dtype=torch.int32))


@pytest.mark.parametrize("kwargs, args, match", [
    ({"sinks": torch.zeros(16)}, {}, "sinks"),
    ({}, {"G": 4}, "G = Hq/Hk"),
    ({}, {"bs": 64}, "block sizes"),
    ({"layout": "aos"}, {}, "SoA"),
    ({"preset": "turboquant_k3v4_nc"}, {}, "turboquant_4bit_nc"),
    ({}, {"slot": 118}, "134-byte slots"),
    ({}, {"dtype": torch.float16}, "bfloat16 queries only"),
])
def test_unsupported_shapes_are_refused_with_the_reason(kwargs, args, match):
    call = {"preset": "turboquant_4bit_nc", "layout": "soa", "rotation": torch.eye(128), **kwargs}
    with pytest.raises(ValueError, match=match):
        launcher.decode(*_args(**args), **call)


def test_seq_lens_beyond_block_table_are_refused():
    q, cache, bt, _ = _args()
    with pytest.raises(ValueError, match="seq_lens"):
        launcher.decode(q, cache, bt, torch.tensor([33], dtype=torch.int32), "turboquant_4bit_nc", "soa",
                        torch.eye(128))


def test_module_cache_is_keyed_by_shape():
    pytest.importorskip("flydsl")
    a = launcher.module(G=8, block_size=16, Hk=2, max_blocks=4, scale=128 ** -0.5)
    assert launcher.module(G=8, block_size=16, Hk=2, max_blocks=4, scale=128 ** -0.5) is a
    assert launcher.module(G=8, block_size=32, Hk=2, max_blocks=4, scale=128 ** -0.5) is not a
