"""Each planted TurboQuant bug fails at least one ci-tier cell under the family's own check (the
tolerances are tight enough to see it), while the correct NumPy reference passes the same cells."""
from types import SimpleNamespace

import numpy as np
import pytest

from conformance.families import turboquant as fam
from reference.turboquant import layout as tq_layout
from reference.turboquant import numpy_ref
from reference.turboquant.presets import preset


def _store_nibbles_swapped(kv_cache, key, value, slot_mapping, p, layout, rotation):
    numpy_ref.store(kv_cache, key, value, slot_mapping, p, layout, rotation)
    pr, D = preset(p), key.shape[-1]
    _, bs, Hk, _ = kv_cache.shape
    slots = np.asarray(slot_mapping)[np.asarray(slot_mapping) >= 0]
    offs = tq_layout.field_offsets(pr, D, Hk, bs, layout, slots[:, None], np.arange(Hk))
    idx = tq_layout.byte_indices(offs["key_data"], pr.key_data_bytes(D))
    flat = kv_cache.reshape(-1)
    flat[idx] = (flat[idx] >> 4) | ((flat[idx] & 0x0F) << 4)
    return kv_cache


def _decode_nc_twice(query, kv_cache, block_table, seq_lens, p, layout, rotation, scale=None, sinks=None):
    """An SoA cache (norm correction folded into the stored scalar) decoded by the AoS rule,
    which applies the correction again."""
    cache = numpy_ref.convert_layout(kv_cache, layout, "aos", p) if layout == "soa" else kv_cache
    return numpy_ref.decode(query, cache, block_table, seq_lens, p, "aos", rotation, scale, sinks)


def _decode_q_transposed(query, kv_cache, block_table, seq_lens, p, layout, rotation, scale=None, sinks=None):
    R = None if rotation is None else np.ascontiguousarray(rotation.T)
    return numpy_ref.decode(query, kv_cache, block_table, seq_lens, p, layout, R, scale, sinks)


def _decode_wrong_head(query, kv_cache, block_table, seq_lens, p, layout, rotation, scale=None, sinks=None):
    """Query head hq reads kv head hq % Hk instead of hq // G."""
    Hq, Hk = query.shape[1], kv_cache.shape[2]
    G = Hq // Hk
    hq = np.arange(Hq)
    j = (hq % Hk) * G + hq // Hk  # a head that, correctly mapped, reads kv head hq % Hk
    q2 = np.empty_like(query)
    q2[:, j] = query[:, hq]
    s2 = None
    if sinks is not None:
        s2 = np.empty_like(sinks)
        s2[j] = sinks[hq]
    out = numpy_ref.decode(q2, kv_cache, block_table, seq_lens, p, layout, rotation, scale, s2)
    return out[:, j]


def _decode_soa_as_aos(query, kv_cache, block_table, seq_lens, p, layout, rotation, scale=None, sinks=None):
    return numpy_ref.decode(query, kv_cache, block_table, seq_lens, p, "aos", rotation, scale, sinks)


PLANTED = {
    "nibbles_swapped": (SimpleNamespace(store=_store_nibbles_swapped, decode=numpy_ref.decode),
                        lambda c: c.op != "decode" and preset(c["preset"]).key_bits == 4),
    "norm_correction_twice": (SimpleNamespace(store=numpy_ref.store, decode=_decode_nc_twice),
                              lambda c: c.op != "store" and c["layout"] == "soa"
                              and preset(c["preset"]).norm_correction),
    "query_rotated_by_transpose": (SimpleNamespace(store=numpy_ref.store, decode=_decode_q_transposed),
                                   lambda c: c.op != "store" and c["rotation"] == "random"),
    "wrong_kv_head_gqa6": (SimpleNamespace(store=numpy_ref.store, decode=_decode_wrong_head),
                           lambda c: c.op != "store" and c["G"] == 6),
    "soa_read_with_aos_offsets": (SimpleNamespace(store=numpy_ref.store, decode=_decode_soa_as_aos),
                                  lambda c: c.op != "store" and c["layout"] == "soa"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_a_ci_cell(bug):
    impl, relevant = PLANTED[bug]
    cells = [c for c in fam.cells("ci") if relevant(c)]
    assert cells, f"no ci cell exercises {bug}"
    failed = []
    for cell in cells:
        inputs = fam.make_inputs(cell)
        fresh = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
        if fam.check(cell, "exact", inputs, fam.run_with(impl, cell, fresh)).status == "fail":
            failed.append(cell.id)
            break
    assert failed, f"planted bug {bug} passed all {len(cells)} relevant ci cells"
    good = fam.run_with(numpy_ref, cell, {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()})
    assert fam.check(cell, "exact", inputs, good).status == "pass", "the correct reference fails the same cell"
