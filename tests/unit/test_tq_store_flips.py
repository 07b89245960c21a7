"""The store-flips study counts the bytes and codes a store writes differently from the NumPy
store, and how far each flipped code's input lies from its decision boundary."""
import numpy as np

from conformance.families import turboquant as tq
from conformance.studies import tq_store_flips
from reference.turboquant import layout as tq_layout
from reference.turboquant import numpy_ref
from reference.turboquant.presets import preset as lookup


class _OneByteOff:
    """The NumPy store, then one key-code byte of the first stored token and head incremented."""

    def run(self, cell, inputs):
        cache = inputs["kv_cache"]
        numpy_ref.store(cache, inputs["key"], inputs["value"], inputs["slot_mapping"], inputs["preset"],
                        inputs["layout"], inputs["rotation"])
        slot = inputs["slot_mapping"][inputs["slot_mapping"] >= 0][:1]
        _, bs, Hk, _ = cache.shape
        offs = tq_layout.field_offsets(lookup(inputs["preset"]), cell["D"], Hk, bs, inputs["layout"],
                                       slot[:, None], np.arange(1))
        flat = cache.reshape(-1)
        i = int(np.asarray(offs["key_data"]).reshape(-1)[0])
        flat[i] = (int(flat[i]) + 1) % 256
        return {"kv_cache": cache}


def test_a_changed_code_byte_is_counted_and_far_from_a_tie():
    cell = next(c for c in tq.cells("ci") if c.op == "store" and c["preset"] == "turboquant_4bit_nc")
    row = tq_store_flips._cell_row(cell, _OneByteOff())
    assert row["diff_bytes"] == 1
    assert row["key_codes"]["flips"] >= 1 and row["value_codes"]["flips"] == 0
    # an arbitrary changed code is almost surely not a rounding tie
    assert row["key_codes"]["ties"] == 0 and row["key_codes"]["max_margin"] > 1


def test_the_reference_store_has_no_flips():
    class _Reference:
        def run(self, cell, inputs):
            return tq.run_with(numpy_ref, cell, inputs)

    cell = next(c for c in tq.cells("ci") if c.op == "store")
    row = tq_store_flips._cell_row(cell, _Reference())
    assert row["diff_bytes"] == 0 and row["key_codes"]["flips"] == 0
