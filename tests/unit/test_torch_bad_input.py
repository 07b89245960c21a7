"""The plain-torch baselines refuse bad input as the references do: non-finite scalars and sinks by
name, data arrays given as Python lists by name; index sequences given as lists are converted. The families'
refusal tables (NaN scales and inputs, tables, gates) run on them as backends in tests/unit/test_refusals.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from optimized.torch.gdn_chunked import chunked  # noqa: E402
from optimized.torch.tq_sdpa import paged_sdpa_decode  # noqa: E402


def _gdn_args(T=6, H=1, HV=2, K=8, V=8):
    g = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), g=-torch.rand(T, HV, generator=g) * 0.1,
                beta=torch.rand(T, HV, generator=g), cu_seqlens=torch.tensor([0, 2, T], dtype=torch.int32),
                state=torch.zeros(3, HV, K, V), state_indices=torch.tensor([2, 0], dtype=torch.int32))


@pytest.mark.parametrize("change,exc,name", [
    (dict(scale=float("inf")), ValueError, "scale"),
    (dict(l2norm_eps=float("nan")), ValueError, "l2norm_eps"),
    (dict(cu_seqlens=[0.0, 2.0, 6.0]), TypeError, "cu_seqlens"),
    (dict(q=[[[0.0] * 8]] * 6), TypeError, "q"),
])
def test_torch_chunked_refuses_by_name(change, exc, name):
    args = _gdn_args()
    with pytest.raises(exc, match=rf"^{name}\b"):
        chunked(**{**args, **change})


def test_torch_chunked_converts_index_lists():
    a, b = _gdn_args(), _gdn_args()
    o = chunked(**a)
    o_lists = chunked(**{**b, "cu_seqlens": [0, 2, 6], "state_indices": [2, 0]})
    assert torch.equal(o, o_lists) and torch.equal(a["state"], b["state"])


def _sdpa_args(B=2, Hq=2, Hk=1, D=8, bs=4, nb=4):
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(nb, bs, Hk, D, generator=g)
    return dict(query=torch.randn(B, Hq, D, generator=g), key_cache=cache, value_cache=cache.clone(),
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([5, 3], dtype=torch.int32))


@pytest.mark.parametrize("change,exc,name", [
    (dict(scale="0.3"), TypeError, "scale"),
    (dict(sinks=torch.tensor([0.0, float("nan")])), ValueError, "sinks"),
    (dict(seq_lens=[5.0, 3.0]), TypeError, "seq_lens"),
    (dict(query=np.zeros((2, 2, 8), np.float32)), TypeError, "query"),
])
def test_torch_sdpa_refuses_by_name(change, exc, name):
    with pytest.raises(exc, match=rf"^{name}\b"):
        paged_sdpa_decode(**{**_sdpa_args(), **change})


def test_torch_sdpa_converts_index_lists():
    a = _sdpa_args()
    expected = paged_sdpa_decode(**a)
    got = paged_sdpa_decode(**{**a, "block_table": [[0, 1], [2, 3]], "seq_lens": [5, 3]})
    assert torch.equal(got, expected)
