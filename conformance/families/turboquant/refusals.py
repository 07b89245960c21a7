"""The TurboQuant argument contract as refusal rows (``conformance.refusals``): what every implementation of an
op refuses, with the error type and the argument its message names, before it writes the cache.
Spoils change the first token, sequence or query row.
"""
from __future__ import annotations

import numpy as np

from conformance.refusals import Refusal, replace, set_entry

POOL = "kv_cache"    # the input a refused call must leave as it was
STORES = ("store", "store_decode")
DECODES = ("decode", "store_decode")
DECODE = ("decode",)   # store_decode would store first: its decode's refusals come after a legal store


def _block_past_cache(x: dict) -> None:
    bt = np.array(x["block_table"])
    bt[0, 0] = x["kv_cache"].shape[0]
    x["block_table"] = bt


def _seq_len_past_table(x: dict) -> None:
    lens = np.array(x["seq_lens"])
    lens[0] = x["block_table"].shape[1] * x["kv_cache"].shape[1] + 1
    x["seq_lens"] = lens


def _nan_key(x: dict) -> None:
    key = np.array(x["key"])
    key[int(np.flatnonzero(np.asarray(x["slot_mapping"]) >= 0)[0]), 0, 0] = np.nan   # a token that is stored
    x["key"] = key


def _slot_past_cache(x: dict) -> None:
    slots = np.array(x["slot_mapping"])
    slots[0] = x["kv_cache"].shape[0] * x["kv_cache"].shape[1]
    x["slot_mapping"] = slots


REFUSALS = (
    Refusal("NaN in the query", DECODE, set_entry("query", np.nan), ValueError, "query"),
    Refusal("a used block id past the cache", DECODE, _block_past_cache, ValueError, "block_table"),
    Refusal("a sequence longer than its block table", DECODE, _seq_len_past_table, ValueError, "seq_lens"),
    Refusal("a sequence of no tokens", DECODE, set_entry("seq_lens", 0), ValueError, "seq_lens"),
    Refusal("a softmax scale beyond float32", DECODE, replace("scale", lambda x: 1e39), ValueError, "scale"),
    Refusal("a NaN softmax scale", DECODE, replace("scale", lambda x: float("nan")), ValueError, "scale"),
    Refusal("NaN in a key", STORES, _nan_key, ValueError, "key"),
    Refusal("a slot past the cache", STORES, _slot_past_cache, ValueError, "slot_mapping"),
)
