"""The fla-chunk-rounding study's emulation of FLA's chunk form (the ``fla-chunk`` oracle) reproduces
the H200 record of FLA itself (ledger/h200/peers_full_cells.jsonl) on small cells: same
verdict under ``bf16-operands``, o rel_l2 within 0.0004."""
import json
import pathlib
import re

import pytest

from conformance.cells import make_cell
from conformance.studies.fla_chunk_rounding import RECORD, cell_row

ROOT = pathlib.Path(__file__).parents[2]
CELLS = (
    # a single token: only the output's rounding differs (zero decay: exp(g) = 1, scale 1/8)
    "gdn/chunked/state=float32/H=16/HV=32/K=64/lens=1/decay=zero/slots=shuffled/split=none/seed=0",
    # K=128 (scale 2^-3.5): q's rounding before the scale
    "gdn/chunked/state=float32/H=4/HV=4/K=128/lens=1+2+3/decay=weak/slots=padded/split=none/seed=0",
    # one full chunk, zero decay: the state increment's placement
    "gdn/chunked/state=float32/H=4/HV=12/K=64/lens=64/decay=zero/slots=padded/split=none/seed=0",
)


@pytest.mark.parametrize("cell_id", CELLS)
def test_emulation_reproduces_the_record(cell_id):
    records = {r["id"]: r for r in map(json.loads, (ROOT / RECORD).read_text().splitlines()) if r["backend"] == "fla"}
    recorded = records[cell_id]
    cell = make_cell("gdn", "chunked", seed=recorded["seed"], **recorded["params"])
    row = cell_row(cell, recorded)
    assert row["recorded"] == row["emulated"] == "fail"
    observed = float(re.match(r"o: rel_l2 ([0-9.e-]+) above", recorded["reason"]).group(1))
    assert abs(row["o_rel_l2"] - observed) <= 4e-4, (row["o_rel_l2"], observed)
    # FLA's distance from the fla-chunk oracle is at least |observed - emulated| (triangle inequality
    # through the bf16-operands oracle): the fla-chunk bound must leave room for it
    assert abs(row["o_rel_l2"] - observed) < row["fla_chunk_o_bound"] / 4
