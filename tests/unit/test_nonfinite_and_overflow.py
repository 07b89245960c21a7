"""Values a kernel's dtype cannot hold are refused alike by the references and every launcher: NaN in
the output rows of padding sequences fails the cell; keys whose norm is beyond float16 (where MSE presets
store it) are refused by name; a read-only pool or cache is named before the NumPy references compute. Scales
beyond float32 and the GDN gate contract are rows of the families' refusal tables (tests/unit/test_refusals.py)."""
import numpy as np
import pytest
import torch

from conformance import families
from conformance.planting import Wrapped
from conformance.testing import verdict_of
from optimized import cpu
from optimized.flydsl import launcher as flydsl
from optimized.triton.tq_store import store as triton_store
from reference.gdn import jax_ref as gdn_jax
from reference.gdn import numpy_ref as gdn_np
from reference.turboquant import jax_ref as tq_jax
from reference.turboquant import numpy_ref as tq_np
from tests.unit.tq_triton_helpers import make_case, t

P = "turboquant_4bit_nc"
HUGE = 1e39  # a finite Python float, Inf in float32


# ---------------------------------------------------------------- NaN in padding rows

def test_nan_in_the_output_rows_of_a_padding_sequence_fails_the_cell():
    cell = next(c for c in families.get("gdn").cells("ci") if c.op == "decode" and c["slots"] == "padded")

    def decode(*args, **kw):
        o = gdn_np.decode(*args, **kw)
        o[np.asarray(args[8]) < 0] = np.nan   # state_indices: -1 marks the padding sequence
        return o

    assert verdict_of(gdn_np, cell, "exact").status == "pass"
    got = verdict_of(Wrapped(gdn_np, decode=decode), cell, "exact")
    assert got.status == "fail" and "o_padding_rows" in got.reason and "NaN/Inf" in got.reason


# ---------------------------------------------------------------- TurboQuant: scale and key norms

@pytest.fixture(scope="module")
def tq_case():
    q, cache, bt, lens, rot, _ = make_case(P, "soa", D=64, G=2, lens=(5, 20))
    return q, cache, bt, lens, rot


def test_the_flydsl_launcher_refuses_a_softmax_scale_beyond_float32_before_it_needs_a_gpu():
    """The family's row (``REFUSALS``) runs on every registered decoder in tests/unit/test_refusals.py; the FlyDSL
    launcher is registered only where a gfx950 runs it, so here it is asked directly."""
    q, cache = torch.zeros(1, 16, 128, dtype=torch.bfloat16), torch.zeros(4, 16, 2, 134, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"scale must be finite in float32"):
        flydsl.decode(q, cache, [[0, 1]], [3], P, "soa", torch.eye(128), scale=HUGE)


def _stores():
    def np_ref(cache, key, value, slots, rot):
        return tq_np.store(cache, key, value, slots, P, "soa", rot)

    def jax_ref(cache, key, value, slots, rot):
        return tq_jax.store(cache, key, value, slots, P, "soa", rot)

    def triton(cache, key, value, slots, rot):
        return triton_store(t(cache), t(key), t(value), t(slots), preset=P, layout="soa", rotation=t(rot))

    return {"numpy-ref": np_ref, "jax-ref": jax_ref, "triton": triton}


@pytest.mark.parametrize("name", list(_stores()))
def test_keys_whose_norm_float16_cannot_hold_are_refused_by_every_store(tq_case, name):
    _, cache, _, _, rot = tq_case
    key = np.zeros((2, 2, 64), np.float32)
    key[1, 0, :] = 9000.0                      # norm 72000 > 65504
    value = np.ones_like(key)
    slots = np.array([0, 1], np.int32)
    with pytest.raises(ValueError, match=r"key holds a vector of L2 norm 72000, beyond float16"):
        _stores()[name](cache.copy(), key, value, slots, rot)
    key[1, 0, :] = 8000.0                      # norm 64000 fits
    _stores()[name](cache.copy(), key, value, slots, rot)


def test_the_numpy_turboquant_store_names_a_read_only_cache(tq_case):
    _, cache, _, _, rot = tq_case
    cache = cache.copy()
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="kv_cache: the NumPy array is read-only"):
        tq_np.store(cache, np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32), [0], P, "soa", rot)


# ---------------------------------------------------------------- GDN: scale, gates, pool

H, HV, K, V, N = 1, 2, 32, 32, 2


def _decode_args(**change):
    rng = np.random.default_rng(0)
    args = dict(q=rng.normal(size=(N, H, K)).astype(np.float32), k=rng.normal(size=(N, H, K)).astype(np.float32),
                v=rng.normal(size=(N, HV, V)).astype(np.float32), A_log=np.zeros(HV, np.float32),
                a=np.zeros((N, HV), np.float32), b=np.zeros((N, HV), np.float32),
                dt_bias=np.zeros(HV, np.float32), state=np.ones((N + 1, HV, K, V), np.float32),
                state_indices=np.arange(N, dtype=np.int32))
    args.update(change)
    return args


GDN_DECODERS = {"numpy-ref": gdn_np.decode, "jax-ref": gdn_jax.decode,
                "cpu-scalar": lambda **a: cpu.gdn_decode(**a, isa="scalar")}
def test_gate_arguments_in_torch_bf16_are_checked_by_the_cpu_launcher():
    """The gate contract's rows (``conformance.families.gdn.REFUSALS``) run on every implementation in
    tests/unit/test_refusals.py; here the CPU launcher reads them from torch bf16."""
    args = {k: torch.from_numpy(v) for k, v in _decode_args(A_log=np.full(HV, 89.0, np.float32)).items()}
    args["a"] = args["a"].to(torch.bfloat16)
    with pytest.raises(ValueError, match="overflows float32"):
        cpu.gdn_decode(**args, isa="scalar")


@pytest.mark.parametrize("op", ["decode", "recurrent", "chunked"])
def test_the_numpy_gdn_reference_names_a_read_only_state_before_computing(op):
    args = _decode_args()
    args["state"].flags.writeable = False
    if op == "decode":
        call = lambda: gdn_np.decode(**args)  # noqa: E731
    else:
        g, beta = gdn_np.gating(args["A_log"], args["a"], args["b"], args["dt_bias"])
        call = lambda: getattr(gdn_np, op)(args["q"], args["k"], args["v"], g, beta,  # noqa: E731
                                           np.arange(N + 1, dtype=np.int32), args["state"], args["state_indices"])
    with pytest.raises(ValueError, match="state: the NumPy array is read-only"):
        call()


def test_finite_gates_still_run():
    for fn in GDN_DECODERS.values():
        fn(**_decode_args(A_log=np.full(HV, 10.0, np.float32), a=np.full((N, HV), 30.0, np.float32)))
