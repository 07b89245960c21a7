"""The GDN dispatch runs the fastest launcher of ``optimized.launchers.LAUNCHERS`` that serves the op and the
call (here, without a GPU, the portable Triton kernels through the interpreter), and an explicit kernel that
cannot serve it fails naming why."""
import pytest
import torch

from optimized import gdn_dispatch
from optimized.triton import gdn_chunked, gdn_recurrent

from tests.unit.tq_triton_helpers import DEVICE

T, H, HV, K, V = 3, 1, 2, 16, 16


def _decode_args():
    g = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), A_log=torch.zeros(HV), a=torch.zeros(T, HV), b=torch.zeros(T, HV),
                dt_bias=torch.zeros(HV), state=torch.ones(T + 1, HV, K, V), state_indices=[2, 0, 1])


def _packed_args():
    g = torch.Generator().manual_seed(1)
    return dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), g=-torch.rand(T, HV, generator=g), beta=torch.rand(T, HV, generator=g),
                cu_seqlens=[0, 1, T], state=torch.ones(3, HV, K, V), state_indices=[2, 0])


@pytest.mark.parametrize("op,launcher,make", [("decode", gdn_recurrent.decode, _decode_args),
                                              ("recurrent", gdn_recurrent.recurrent, _packed_args),
                                              ("chunked", gdn_chunked.chunked, _packed_args)])
def test_auto_runs_the_launcher_the_table_names(op, launcher, make):
    a, b = make(), make()
    a["state"], b["state"] = a["state"].to(DEVICE), b["state"].to(DEVICE)
    want = launcher(**{k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in a.items()})
    got = getattr(gdn_dispatch, op)(**{k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in b.items()})
    assert torch.equal(got, want) and torch.equal(a["state"], b["state"])


def test_an_explicit_kernel_that_cannot_serve_fails_naming_why():
    with pytest.raises(ValueError, match=r"kernel must be 'auto' or one of \('triton-gdn-chunked',\) for chunked"):
        gdn_dispatch.chunked(**_packed_args(), kernel="triton-gdn")
    args = _decode_args()
    args["state"] = args["state"].double()
    with pytest.raises(TypeError, match="state must have dtype"):
        gdn_dispatch.decode(**args)
    q = torch.zeros(T, H, 512)
    with pytest.raises(ValueError, match=r"no GDN decode kernel serves this call: "
                                         r"\{'triton-gdn-sm90': 'q: key head size.*'triton-gdn': 'q: key head size"):
        gdn_dispatch.choose("decode", q, _decode_args()["v"], _decode_args()["state"])
    with pytest.raises(ValueError, match="op must be one of"):
        gdn_dispatch.kernels("gating")
