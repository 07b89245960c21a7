"""The GDN argument contract as refusal rows (``conformance.refusals``): what every implementation of an op
refuses, with the error type and the argument its message names, before it touches the pool.

The gate contract (``reference.gdn.arguments``): a log-decay g, given (recurrent, chunked) or computed as
-exp(A_log) softplus(a + dt_bias) (gating, decode, spec_decode), lies in [``G_MIN``, 0]: above 0 it is a
growth, not a decay; below ``G_MIN`` = -float32 max / 64 its sum over a 64-token chunk overflows float32.
exp(A_log) and a + dt_bias must be finite in float32. Large legitimate gates run: softplus(x) = x above 20,
so a + dt_bias of 100 or 10^4 gives g = -exp(A_log) x, far inside the range.
Spoils change token 0, which the first call of a driver's chain always holds.
"""
from __future__ import annotations

import numpy as np

from conformance.refusals import Refusal, both, replace, set_entry

POOL = "state"    # the input a refused call must leave as it was
ALL = ("recurrent", "chunked", "decode", "spec_decode")
GIVEN_G = ("recurrent", "chunked")
GATED = ("gating", "decode", "spec_decode")
PACKED = ("recurrent", "chunked", "spec_decode")
SLOTTED = ("recurrent", "chunked", "decode")


def _slot_out_of_range(x: dict) -> None:
    idx = np.array(x["state_indices"])
    idx[0] = x["state"].shape[0]
    x["state_indices"] = idx


def _cu_past_t(x: dict) -> None:
    cu = np.array(x["cu_seqlens"])
    cu[-1] += 1
    x["cu_seqlens"] = cu


def _accepted_past_columns(x: dict) -> None:
    acc = np.array(x["num_accepted_tokens"])
    acc[0] = x["spec_state_indices"].shape[1] + 1
    x["num_accepted_tokens"] = acc


REFUSALS = (
    Refusal("NaN in q", ALL, set_entry("q", np.nan), ValueError, "q"),
    Refusal("Inf in k", ALL, set_entry("k", np.inf), ValueError, "k"),
    Refusal("NaN in v", ALL, set_entry("v", np.nan), ValueError, "v"),
    Refusal("NaN in beta", GIVEN_G, set_entry("beta", np.nan), ValueError, "beta"),
    Refusal("NaN in a", GATED, set_entry("a", np.nan), ValueError, "a"),
    Refusal("NaN in b", GATED, set_entry("b", np.nan), ValueError, "b"),
    Refusal("k with one head dimension fewer than q", ALL, replace("k", lambda x: x["k"][..., :-1].copy()),
            ValueError, "k"),
    # the gate contract: g in [G_MIN, 0], exp(A_log) and a + dt_bias finite in float32
    Refusal("g above 0 (a growth, +50)", GIVEN_G, set_entry("g", 50.0), ValueError, "g"),
    Refusal("NaN in g", GIVEN_G, set_entry("g", np.nan), ValueError, "g"),
    Refusal("g below -float32 max / 64 (a chunk's sum overflows)", GIVEN_G, set_entry("g", -1e37), ValueError, "g"),
    Refusal("exp(A_log) overflows float32 (A_log 100, a -200)", GATED,
            both(set_entry("A_log", 100.0), set_entry("a", -200.0)), ValueError, "A_log"),
    Refusal("exp(A_log) overflows float32 (A_log 89)", GATED, set_entry("A_log", 89.0), ValueError, "A_log"),
    Refusal("the gate overflows (A_log 60, a 3e12)", GATED, both(set_entry("A_log", 60.0), set_entry("a", 3e12)),
            ValueError, "a"),
    Refusal("a + dt_bias overflows float32", GATED, both(set_entry("a", 3e38), set_entry("dt_bias", 3e38)),
            ValueError, "dt_bias"),
    # tables and scalars
    Refusal("a state slot past the pool", SLOTTED, _slot_out_of_range, ValueError, "state_indices"),
    Refusal("cu_seqlens ending past T", PACKED, _cu_past_t, ValueError, "cu_seqlens"),
    Refusal("num_accepted_tokens past the slot columns", ("spec_decode",), _accepted_past_columns, ValueError,
            "num_accepted_tokens"),
    Refusal("scale beyond float32", ALL, replace("scale", lambda x: 1e39), ValueError, "scale"),
    Refusal("a NaN scale", ALL, replace("scale", lambda x: float("nan")), ValueError, "scale"),
    Refusal("a negative l2norm_eps", ALL, replace("l2norm_eps", lambda x: -1.0), ValueError, "l2norm_eps"),
)
