"""The NumPy emulation of the FlyDSL decode kernel (backend ``flydsl-emulated``) against the
turboquant family's ``act-mma`` oracle, on the kernel's shapes, and planted bugs it must catch."""
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from conformance import registry
from conformance.cells import make_cell
from conformance.families import turboquant as fam
from conformance.run.inprocess import inputs_copy
from conformance.testing import PLANTED, first_failing_cell
from optimized.flydsl import emulation, plan

BACKEND = registry.get("flydsl-emulated")


def _cell(Hk, G, bs, lens, rotation="random"):
    return make_cell("turboquant", "decode", preset="turboquant_4bit_nc", layout="soa", Hk=Hk, G=G, bs=bs,
                     lens=tuple(lens), rotation=rotation, sinks=False, D=128, seed=0)


# Every supported (G, block size); lengths cross tile (32) and partition (64) edges, and a length 1.
CELLS = [_cell(4, 6, 16, (33, 16, 1, 32)), _cell(2, 8, 32, (200, 64, 65)), _cell(2, 16, 16, (129, 7)),
         _cell(1, 6, 32, (96, 31), "hadamard"), _cell(2, 8, 16, (1, 250)), _cell(1, 16, 32, (64,))]


def _verdict(cell):
    inputs = fam.make_inputs(cell)
    outputs = BACKEND.run(cell, inputs_copy(inputs))
    return fam.check(cell, BACKEND.rounding_model("turboquant"), inputs, outputs)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
def test_emulation_passes_act_mma_oracle(cell):
    assert BACKEND.skip_reason(cell) is None
    v = _verdict(cell)
    assert v.status == "pass", v.reason


def test_unsupported_cells_are_skips_with_reason():
    sinks = make_cell("turboquant", "decode", preset="turboquant_4bit_nc", layout="soa", Hk=2, G=8, bs=16,
                      lens=(5,), rotation="random", sinks=True, D=128, seed=0)
    assert "sinks" in BACKEND.skip_reason(sinks)
    aos = make_cell("turboquant", "decode", preset="turboquant_4bit_nc", layout="aos", Hk=2, G=8, bs=16,
                    lens=(5,), rotation="random", sinks=False, D=128, seed=0)
    assert "SoA" in BACKEND.skip_reason(aos)
    ok = dict(preset=plan.PRESET, layout="soa", D=128, sinks=False, act="bfloat16")
    assert "G = Hq/Hk" in plan.unsupported(**ok, block_size=16, G=4)
    assert "block sizes" in plan.unsupported(**ok, block_size=64, G=8)
    assert "bfloat16 queries only" in plan.unsupported(**{**ok, "act": "float16"}, block_size=16, G=8)
    fp16 = make_cell("turboquant", "decode", preset="turboquant_4bit_nc", layout="soa", Hk=2, G=8, bs=16,
                     lens=(5,), rotation="random", sinks=False, D=128, act="float16", seed=0)
    assert "bf16" in BACKEND.skip_reason(fp16)


def test_decode_rejects_bad_input():
    with pytest.raises(ValueError, match="query"):
        emulation.decode(np.zeros((2, 8), np.float32), np.zeros((1, 16, 1, 134), np.uint8), np.zeros((2, 1), np.int32),
                         np.ones(2, np.int32), plan.PRESET, "soa", np.eye(128, dtype=np.float32))
    with pytest.raises(ValueError, match="bfloat16 queries only"):
        emulation.decode(np.zeros((1, 8, 128), np.float16), np.zeros((1, 16, 1, 134), np.uint8),
                         np.zeros((1, 1), np.int32), np.array([1], np.int32), plan.PRESET, "soa",
                         np.eye(128, dtype=np.float32))
    with pytest.raises(ValueError, match="seq_lens"):
        emulation.decode(np.zeros((1, 8, 128), ml_dtypes.bfloat16), np.zeros((1, 16, 1, 134), np.uint8),
                         np.zeros((1, 1), np.int32), np.array([17], np.int32), plan.PRESET, "soa",
                         np.eye(128, dtype=np.float32))


def test_partition_count_follows_block_table_width():
    assert plan.num_parts(1, 16) == 1 and plan.num_parts(4, 16) == 1 and plan.num_parts(5, 16) == 2
    assert plan.num_parts(16, 32) == 8


# ---- planted bugs: each must make at least one of CELLS fail -----------------------------------

def _swap_nibbles(read_fields):
    def wrapped(*args, **kwargs):
        f = read_fields(*args, **kwargs)
        codes = f["key_codes"].copy()
        codes[..., 0::2], codes[..., 1::2] = f["key_codes"][..., 1::2], f["key_codes"][..., 0::2]
        return {**f, "key_codes": codes}
    return wrapped


def _truncating_bf16(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _unweighted_reduce(o, m, l):
    B, Hk, P, G, D = o.shape
    used = (l > 0).sum(axis=2)[..., None]
    return (o.sum(axis=2) / np.maximum(used, 1)).reshape(B, Hk * G, D).astype(np.float32)


BUGS = {
    "nibble order swapped": ("read_fields", lambda: _swap_nibbles(emulation.read_fields)),
    "bf16 truncation instead of RNE": ("bf16", lambda: _truncating_bf16),
    "exp instead of exp2 scaling": ("LOG2E", lambda: 1.0),
    "partitions averaged, not weighted": ("reduce_partitions", lambda: _unweighted_reduce),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_is_caught(bug, monkeypatch):
    name, make = BUGS[bug]
    monkeypatch.setattr(emulation, name, make())
    statuses = [_verdict(c).status for c in CELLS]
    assert "fail" in statuses, f"{bug}: every cell still passes"


@pytest.mark.parametrize("bug", ["turboquant.wrong-kv-head", "turboquant.query-rotated-by-transpose",
                                 "turboquant.last-token-skipped"])
def test_library_bug_planted_in_the_emulation_is_caught(bug):
    planted = PLANTED[bug]
    impl = planted.plant(SimpleNamespace(decode=emulation.decode))
    cells = [c for c in CELLS if planted.applies(c)]
    assert first_failing_cell(impl, "turboquant", BACKEND.rounding_model("turboquant"), cells), \
        f"{bug}: every cell still passes"
