"""`kernel-lab conform --inputs FILE`: cells whose inputs are a file of captured tensors (.npz,
.safetensors), written here from generated tensors and from a tiny torch module's forward pre-hook."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conformance import families
from conformance.families.gdn import make_inputs as gdn_inputs, matrix as gdn_matrix
from conformance.families.gdn.captured import KEYS as GDN_FILE_KEYS
from conformance.families.turboquant import make_inputs as tq_inputs, matrix as tq_matrix
from conformance.families.turboquant.captured import KEYS as TQ_FILE_KEYS, OPTIONAL_KEYS as TQ_OPTIONAL
from conformance.inputs import capture, captured, tensor_files
from conformance.memo import Memo
from conformance.run import records
from conformance.run.inprocess import run_one
from reference.turboquant.presets import preset
from tests.cli_in_process import main, one_error_line

ROOT = Path(__file__).resolve().parents[2]
SAFETENSORS = pytest.mark.skipif(importlib.util.find_spec("safetensors") is None,
                                 reason="the safetensors package is not installed (make setup installs it)")
GDN_KEYS = GDN_FILE_KEYS["decode"]
TQ_KEYS = TQ_FILE_KEYS["decode"] + TQ_OPTIONAL["decode"]
GDN_CELL = gdn_matrix.cell_of("decode", dict(state="bfloat16", heads=(2, 4), KV=(32, 32), N=3, decay="weak",
                                             slots="padded", qk="unit", act="bfloat16"))
TQ_CELL = tq_matrix.decode_cell("decode", "turboquant_4bit_nc", "soa", (2, 8), 16, (20, 7), "hadamard", False)


def gdn_arrays(cell=GDN_CELL) -> dict:
    x = gdn_inputs(cell)
    return {k: x[k] for k in GDN_KEYS}


def tq_arrays(cell=TQ_CELL) -> dict:
    x = tq_inputs(cell)
    return {k: x[k] for k in TQ_KEYS if x[k] is not None}




def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- files to cells

@pytest.mark.parametrize("suffix", [".npz", pytest.param(".safetensors", marks=SAFETENSORS)])
def test_a_gdn_decode_file_is_the_matrix_cell_of_its_shapes_with_the_same_inputs(tmp_path, suffix):
    arrays = gdn_arrays()
    path = capture.save(tmp_path / f"layer{suffix}", arrays)
    cell = captured.file_cell(path, "gdn", "decode")
    digest = captured.sha256(path)[:captured.DIGEST_CHARS]
    assert cell.as_dict() == dict(state="bfloat16", H=2, HV=4, K=32, V=32, N=4, slots="padded", act="bfloat16",
                                  inputs=digest)
    assert f"/inputs={digest}/" in cell.id and cell.source == str(path.resolve())
    inputs = captured.load_inputs(cell)
    assert all(same_bits(inputs[k], arrays[k]) for k in GDN_KEYS)   # bfloat16 kept in both formats
    assert inputs["state_dtype"] == "bfloat16" and inputs["scale"] is None


def verdict(cell, backend: str) -> tuple:
    """What decides a record: status, margin and the tolerance (its source words included)."""
    r = run_one(cell, backend, Memo())
    return r["status"], r["metrics"], r["tolerance"]


GDN_OPS_CELLS = [
    next(c for c in gdn_matrix.cells("smoke") if c.op == "recurrent"),
    next(c for c in gdn_matrix.cells("ci") if c.op == "chunked" and c["split"] is None and c["slots"] == "padded"
         and c["K"] == 64 and sum(c["lens"]) < 200),
    next(c for c in gdn_matrix.cells("smoke") if c.op == "decode"),
    next(c for c in gdn_matrix.cells("smoke") if c.op == "spec_decode"),
]


@pytest.mark.parametrize("cell", GDN_OPS_CELLS, ids=lambda c: c.op)
def test_a_gdn_file_of_any_op_is_judged_as_the_matrix_cell_it_was_written_from(tmp_path, cell):
    x = gdn_inputs(cell)
    strings = {"state_write_interval": str(x["state_write_interval"])} if cell.op == "recurrent" else {}
    path = capture.save(tmp_path / "layer.npz", {k: x[k] for k in GDN_FILE_KEYS[cell.op]}, strings)
    file_cell = captured.file_cell(path, "gdn", cell.op)
    drawn = {k: v for k, v in cell.as_dict().items() if k not in ("decay", "qk", "accepted", "N", "lens", "drafts")}
    assert {k: v for k, v in file_cell.as_dict().items() if k in drawn} == drawn
    assert verdict(file_cell, "numpy-ref") == verdict(cell, "numpy-ref")


@pytest.mark.parametrize("cell", [
    *tq_matrix.cells("smoke"),
    tq_matrix.decode_cell("decode", "turboquant_3bit_nc", "aos", (4, 2), 32, (3, 1, 40), "random", True, D=64,
                          act="float32"),
    tq_matrix.decode_cell("decode", "turboquant_k3v4_nc", "soa", (1, 4), 16, (33,), "random", False, D=64),
], ids=lambda c: f"{c.op}-{c['preset']}-{c['layout']}")
def test_a_turboquant_file_gives_its_preset_layout_rotation_and_shapes_and_the_matrix_verdict(tmp_path, cell):
    x = tq_inputs(cell)
    arrays = {k: x[k] for k in TQ_FILE_KEYS[cell.op] + TQ_OPTIONAL[cell.op] if x.get(k) is not None}
    strings = {"layout": cell["layout"]} if cell.op == "store" else {}   # a store's cache does not show it
    file_cell = captured.file_cell(capture.save(tmp_path / "layer.npz", arrays, strings), "turboquant", cell.op)
    want = {k: v for k, v in cell.as_dict().items() if k != "range"}
    assert {k: v for k, v in file_cell.as_dict().items() if k != "inputs"} == want
    inputs = captured.load_inputs(file_cell)
    assert all(same_bits(inputs[k], arrays[k]) for k in arrays)
    assert cell.op == "store" or inputs["scale"] == pytest.approx(1 / np.sqrt(cell["D"]))
    assert verdict(file_cell, "numpy-ref") == verdict(cell, "numpy-ref")


@SAFETENSORS
def test_a_named_layout_is_taken_and_a_cache_no_layout_can_tell_must_name_it(tmp_path):
    arrays = {**tq_arrays(), "kv_cache": np.zeros_like(tq_arrays()["kv_cache"])}
    path = capture.save(tmp_path / "zeros.safetensors", arrays, {"layout": "aos", "scale": "0.125"})
    cell = captured.file_cell(path, "turboquant", "decode")
    assert cell["layout"] == "aos" and captured.load_inputs(cell)["scale"] == 0.125
    capture.save(tmp_path / "unnamed.npz", arrays)
    with pytest.raises(ValueError, match="layout: both read"):
        captured.file_cell(tmp_path / "unnamed.npz", "turboquant", "decode")


def test_a_tensor_file_keeps_strings_apart_and_refuses_pickles(tmp_path):
    arrays, strings = tensor_files.read(tensor_files.write(tmp_path / "t.npz", {"x": np.arange(3)}, {"layout": "soa"}))
    assert list(arrays) == ["x"] and strings == {"layout": "soa"}
    with pytest.raises(ValueError, match="names used both for an array and a string: x"):
        tensor_files.write(tmp_path / "t.npz", {"x": np.arange(3)}, {"x": "soa"})
    np.savez(tmp_path / "pickle.npz", x=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(tensor_files.TensorFileError, match="holds an object array"):
        tensor_files.read(tmp_path / "pickle.npz")


def test_a_worker_refuses_a_file_changed_since_its_cell_was_made(tmp_path):
    path = capture.save(tmp_path / "layer.npz", gdn_arrays())
    cell = captured.file_cell(path, "gdn", "decode")
    capture.save(path, {**gdn_arrays(), "q": gdn_arrays()["q"] * 2})
    with pytest.raises(ValueError, match=f"changed since the run began \\(sha256 {cell['inputs']}, now "):
        captured.load_inputs(cell)


# ---------------------------------------------------------------- bad files: one line naming the key

def _gdn(change):
    def make():
        arrays = gdn_arrays()
        change(arrays)
        return "gdn/decode", arrays, {}
    return make


def _varlen(change, strings=None):
    def make():
        cell = GDN_OPS_CELLS[0]
        x = gdn_inputs(cell)
        arrays = {k: x[k] for k in GDN_FILE_KEYS[cell.op]}
        change(arrays)
        return "gdn/recurrent", arrays, strings or {}
    return make


def _spec(change):
    def make():
        x = gdn_inputs(GDN_OPS_CELLS[3])
        arrays = {k: x[k] for k in GDN_FILE_KEYS["spec_decode"]}
        change(arrays)
        return "gdn/spec_decode", arrays, {}
    return make


def _store(change, strings=None):
    def make():
        x = tq_inputs(next(c for c in tq_matrix.cells("smoke") if c.op == "store"))
        arrays = {k: x[k] for k in TQ_FILE_KEYS["store"] + TQ_OPTIONAL["store"]}
        change(arrays)
        return "turboquant/store", arrays, strings or {}
    return make


def _tq(change, strings=None):
    def make():
        arrays = tq_arrays()
        change(arrays)
        return "turboquant/decode", arrays, strings or {}
    return make


def _set(key, value):
    return lambda a: a.__setitem__(key, value(a))


def _poke(key, index, value):
    return lambda a: a[key].__setitem__(index, value(a))


BAD = {
    "missing": (_gdn(lambda a: a.pop("state_indices")), "state_indices: missing"),
    "extra": (_gdn(_set("g", lambda a: np.zeros((4, 4), np.float32))), "'g': not an argument of this op"),
    "act-dtype": (_gdn(_set("q", lambda a: a["q"].astype(np.float64))),
                  "q: dtype float64, expected bfloat16 or float16 or float32"),
    "mixed-act": (_gdn(_set("k", lambda a: a["k"].astype(np.float16))), "k: dtype float16, expected bfloat16"),
    "state-dtype": (_gdn(_set("state", lambda a: a["state"].astype(np.float64))), "state: dtype float64"),
    "index-dtype": (_gdn(_set("state_indices", lambda a: a["state_indices"].astype(np.float32))),
                    "state_indices: dtype float32, expected int32 or int64"),
    "k-heads": (_gdn(_set("k", lambda a: a["k"][:, :1])),   # q and k disagree alone: the larger is named
                "q: declared shape [4, 2, 32]; k implies [4, 1, 32] (T, H, K)"),
    "v-heads": (_gdn(_set("v", lambda a: a["v"][:, :3])),
                "v: declared shape [4, 3, 32]; A_log, a, b, dt_bias, state imply [4, 4, 32] (T, HV, V)"),
    "state-shape": (_gdn(_set("state", lambda a: a["state"][..., :16])),   # V: v and state alone, the smaller
                    "v: declared shape [4, 4, 32]; state implies [4, 4, 16] (T, HV, V)"),
    "index-outside-pool": (_gdn(_poke("state_indices", 0, lambda a: a["state"].shape[0])),
                           "state_indices: slot index out of range [-1, 5)"),
    "all-padding": (_gdn(_set("state_indices", lambda a: np.full(4, -1, np.int32))),
                    "state_indices: every sequence is padding"),
    "no-rotation": (_tq(lambda a: a.pop("rotation")), "rotation: missing"),
    "store-layout": (_store(lambda a: None), "layout: a store's cache does not show its layout"),
    "slot-outside-cache": (_store(_poke("slot_mapping", 0, lambda a: a["kv_cache"].shape[0] * 16), {"layout": "aos"}),
                           "slot_mapping entries must be < num_blocks * block_size"),
    "value-dtype": (_store(_set("value", lambda a: a["value"].astype(np.float32)), {"layout": "aos"}),
                    "value: dtype float32, expected bfloat16 (the dtype of key)"),
    "cu-seqlens": (_varlen(_poke("cu_seqlens", -1, lambda a: a["q"].shape[0] - 1)),
                   "cu_seqlens: expected to start at 0 and end at T="),
    "log-decay-dtype": (_varlen(_set("g", lambda a: a["g"].astype(np.float16))),
                        "g: dtype float16, expected float32"),
    "growing-state": (_varlen(_set("g", lambda a: np.abs(a["g"]) + 1)), "g: expected log-decays <= 0"),
    "interval": (_varlen(lambda a: None, {"state_write_interval": "often"}),
                 "state_write_interval: 'often'; expected a whole number >= 1"),
    "accepted": (_spec(_poke("num_accepted_tokens", 0, lambda a: a["spec_state_indices"].shape[1] + 1)),
                 "num_accepted_tokens: expected values in [0, "),
    "block-outside-cache": (_tq(_poke("block_table", (1, 0), lambda a: a["kv_cache"].shape[0])),
                            "block_table row 1 uses a block outside [0, "),
    "seq-beyond-blocks": (_tq(_poke("seq_lens", 0, lambda a: a["block_table"].shape[1] * 16 + 1)),
                          "seq_lens must be in [1, block_table columns * block_size"),
    "slot-size": (_tq(_set("kv_cache", lambda a: np.ascontiguousarray(a["kv_cache"][..., :-2]))),
                  "kv_cache: last dimension 132 is no preset's slot size at D=128"),
    "named-preset": (_tq(lambda a: None, {"preset": "turboquant_3bit_nc"}),
                     "kv_cache: last dimension 134, expected 102"),
    "query-heads": (_tq(_set("query", lambda a: a["query"][:, :15])), "query heads Hq=15 must be a multiple"),
    "cache-dtype": (_tq(_set("kv_cache", lambda a: a["kv_cache"].astype(np.int16))),
                    "kv_cache: dtype int16, expected uint8"),
    "string": (_tq(lambda a: None, {"bits": "4"}), "'bits': an unexpected string"),
    "scale": (_tq(lambda a: None, {"scale": "one"}), "scale: 'one' is not a number"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_one_error_line_naming_the_key(tmp_path, capsys, case):
    make, expected = BAD[case]
    where, arrays, strings = make()
    family, op = where.split("/")
    path = capture.save(tmp_path / "bad.npz", arrays, strings)
    rc, _, err = main(capsys, "conform", "--inputs", path, "--family", family, "--op", op,
                      "--backend", "numpy-ref", "--out", tmp_path / "run")
    line = one_error_line(err)
    assert rc == 2 and f"--inputs {path}: " in line and expected in line, line
    assert not (tmp_path / "run" / "cells.jsonl").exists()


@pytest.mark.parametrize("name,content,args,expected", [
    ("layer.pt", b"", ("--family", "gdn", "--op", "decode"), "expected a .npz or .safetensors file"),
    ("layer.npz", b"not a zip", ("--family", "gdn", "--op", "decode"), "not a readable .npz file"),
    pytest.param("layer.safetensors", b"\x10\0\0\0\0\0\0\0{", ("--family", "gdn", "--op", "decode"),
                 "not a readable .safetensors file", marks=SAFETENSORS),
    ("absent.npz", None, ("--family", "gdn", "--op", "decode"), "no such file"),
    ("layer.npz", "gdn", ("--family", "gdn", "--op", "gating"), "gdn/gating does not take a file; supported: "
     "gdn/recurrent, gdn/chunked, gdn/decode, gdn/spec_decode, turboquant/store, turboquant/decode, "
     "turboquant/store_decode"),
    ("layer.npz", "gdn", ("--family", "gdn"), "--inputs: name the op"),
    ("layer.npz", "gdn", ("--family", "gdn", "--op", "decode", "--filter", "x"), "leave out --filter"),
])
def test_an_unreadable_file_or_request_is_one_error_line(tmp_path, capsys, name, content, args, expected):
    path = tmp_path / name
    if content == "gdn":
        capture.save(path, gdn_arrays())
    elif content is not None:
        path.write_bytes(content)
    rc, _, err = main(capsys, "conform", "--inputs", path, *args, "--backend", "numpy-ref", "--out", tmp_path / "r")
    assert rc == 2 and expected in one_error_line(err)


# ---------------------------------------------------------------- capture from a torch module, end to end

@pytest.fixture
def planted(monkeypatch):
    """The planted-bug backends, in this process and in the workers it spawns."""
    monkeypatch.setenv("KERNEL_LAB_BACKEND_MODULES", "tests.unit.planted_backends")
    import tests.unit.planted_backends  # noqa: F401  (registers them here)


def tiny_gdn_layer(arrays: dict):
    """A torch module holding A_log and dt_bias whose forward takes the rest of a decode's arguments
    (under other names) and updates its state pool in place, as a decode layer does."""
    import torch

    from conformance.torch_arrays import to_torch

    class TinyDecode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = torch.nn.Parameter(to_torch(arrays["A_log"]), requires_grad=False)
            self.dt_bias = torch.nn.Parameter(to_torch(arrays["dt_bias"]), requires_grad=False)

        def forward(self, query, key, value, a, b, ssm_state, state_indices):
            ssm_state.mul_(0.5)
            return query

    return TinyDecode()


def records_of(out):
    return {r["backend"]: r for r in records.read(out / "cells.jsonl")}


def readme_capture_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Captured tensors"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class TinyModel:
    """``generate`` calls the layer as a model would: a one-sequence step, then two of every row."""

    def __init__(self, layer, call: list):
        self.layer, self.call = layer, call

    def generate(self, _):
        call = self.call
        self.layer(*(t[:1] for t in call[:5]), call[5].clone(), call[6][:1])
        self.layer(*call)
        self.layer(*call)


@SAFETENSORS
def test_the_readme_capture_of_a_torch_layer_runs_on_every_backend_and_the_planted_bug_fails(
        tmp_path, capsys, monkeypatch, planted):
    from conformance.torch_arrays import to_torch

    arrays = gdn_arrays()
    call = [to_torch(np.array(arrays[n], copy=True)) for n in ("q", "k", "v", "a", "b", "state", "state_indices")]
    monkeypatch.chdir(tmp_path)
    layer = tiny_gdn_layer(arrays)
    exec(readme_capture_snippet(), {"layer": layer, "model": TinyModel(layer, call)})
    path = tmp_path / "gdn-decode.safetensors"
    assert same_bits(captured.load_inputs(captured.file_cell(path, "gdn", "decode"))["state"], arrays["state"])
    out = tmp_path / "run"
    args = ("conform", "--inputs", path, "--family", "gdn", "--op", "decode", "--out", out,
            "--backend", "numpy-ref,cpu-scalar,numpy-ref-heads-tiled")
    rc, _, _ = main(capsys, *args)
    recs = records_of(out)
    assert rc == 1 and {b: r["status"] for b, r in recs.items()} == {
        "numpy-ref": "pass", "cpu-scalar": "pass", "numpy-ref-heads-tiled": "fail"}
    digest = captured.sha256(path)
    assert {r["params"]["inputs"] for r in recs.values()} == {digest[:captured.DIGEST_CHARS]}
    assert json.loads((out / "run.json").read_text())["selection"]["inputs"] == f"sha256:{digest}"
    rc, _, err = main(capsys, *args, "--resume")
    assert rc == 1 and "0 to run, 0 skip, 3 already recorded" in err
    capture.save(path, {**arrays, "state": arrays["state"] * 2})
    rc, _, err = main(capsys, *args, "--resume")
    assert rc == 2 and f"inputs was 'sha256:{digest}'" in one_error_line(err)


def test_a_captured_turboquant_decode_runs_its_backends_and_the_planted_bug_fails(tmp_path, capsys, planted):
    path = capture.save(tmp_path / "decode.npz", tq_arrays())
    out = tmp_path / "run"
    rc, _, _ = main(capsys, "conform", "--inputs", path, "--family", "turboquant", "--op", "decode", "--out", out,
                    "--backend", "numpy-ref,flydsl-emulated,torch-sdpa,numpy-ref-wrong-kv-head")
    recs = records_of(out)
    assert rc == 1 and {b: r["status"] for b, r in recs.items()} == {
        "numpy-ref": "pass", "flydsl-emulated": "pass", "torch-sdpa": "skip", "numpy-ref-wrong-kv-head": "fail"}
    assert "captured cache" in recs["torch-sdpa"]["reason"]


def test_the_repro_command_of_a_captured_cell_names_its_file():
    from conformance.run import repro

    cell_id = "turboquant/decode/preset=turboquant_4bit_nc/layout=soa/inputs=029c86851720/seed=0"
    assert repro.command(cell_id, "triton", "ci", inputs="/data/layer 3.npz") == (
        "kernel-lab conform --inputs '/data/layer 3.npz' --family turboquant --op decode --backend triton")


def test_a_file_key_with_escape_sequences_reaches_the_console_escaped(tmp_path):
    import subprocess
    import sys

    arrays = gdn_arrays()
    arrays["\x1b]0;retitled\x07\x1b[2J"] = np.zeros(2, np.float32)
    path = tensor_files.write(tmp_path / "odd.npz", arrays)
    res = subprocess.run([sys.executable, "-m", "kernel_lab", "conform", "--family", "gdn", "--op", GDN_CELL.op,
                          "--inputs", str(path), "--backend", "numpy-ref", "--out", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "\x1b" not in res.stderr and "\x07" not in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1
    assert "'\\x1b]0;retitled\\x07\\x1b[2J': not an argument of this op" in res.stderr


# ---------------------------------------------------------------- hostile files: bounded reads, each fault named

def _npz(path, members: dict[str, bytes]):
    """An .npz written member by member (deflated), as a forger would."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _npy(shape, dtype="<f4", data: bytes = b"") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def _good_members(arrays: dict | None = None) -> dict[str, bytes]:
    """``arrays`` (default: a GDN decode's) as .npy members, bfloat16 as NumPy writes it (``<V2``)."""
    import io

    out = {}
    for k, a in (gdn_arrays() if arrays is None else arrays).items():
        buf = io.BytesIO()
        np.save(buf, a)
        out[k + ".npy"] = buf.getvalue()
    return out


def _with_zeros(path, members: dict[str, bytes], name: str, shape: tuple, descr: str = "<f4"):
    """``members`` and a member ``name`` of ``shape`` holding zeros (deflated: 256 MiB is about 250 KB),
    its data written in 16 MiB pieces, as a forger would."""
    import zipfile

    nbytes = int(np.prod(shape)) * np.dtype(descr).itemsize
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        with zf.open(name, "w", force_zip64=True) as fh:
            fh.write(_npy(shape, descr))
            zeros = bytes(16 << 20)
            for start in range(0, nbytes, len(zeros)):
                fh.write(zeros[:nbytes - start])
    assert path.stat().st_size < 2 << 20
    return path


def _peak_of(call) -> int:
    """The peak of Python and NumPy allocations (tracemalloc) while ``call()`` runs."""
    import tracemalloc

    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("case, members, words", [
    ("1e12 rows", {"q.npy": _npy((10**12, 2, 32), data=b"\0" * 64)},
     "member 'q.npy': its header declares shape [1000000000000, 2, 32] of float32 (233 TiB) but the member "
     "holds 64 B of data (truncated or forged)"),
    ("2^62 rows", {"q.npy": _npy((2**62, 2))}, "member 'q.npy': its header declares shape [4611686018427387904, 2]"),
    ("negative", {"q.npy": _npy((-3, 4))}, "member 'q.npy': its header declares shape [-3, 4], a negative dimension"),
    ("truncated", {"q.npy": _npy((4, 2, 32), data=b"\0" * 100)}, "but the member holds 100 B of data (truncated"),
    ("not .npy", {"q.npy": _npy((1,), data=b"\0" * 4), "notes.txt": b"hello"},
     "member 'notes.txt' is not a .npy array (an .npz holds .npy members only)"),
    ("not a header", {"q.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': 1}    \n"}, "member 'q.npy': not a valid .npy header"),
])
def test_a_forged_npz_member_is_named_for_what_is_wrong_with_it(tmp_path, capsys, case, members, words):
    path = _npz(tmp_path / "forged.npz", {**_good_members(), **members})
    rc, _, err = main(capsys, "conform", "--family", "gdn", "--op", "decode", "--inputs", path,
                      "--backend", "numpy-ref", "--out", tmp_path / "run")
    line = one_error_line(err)
    assert rc == 2 and words in line and "pickle" not in line, line


def test_a_compressed_bomb_under_a_name_the_op_does_not_take_is_refused_before_it_is_decompressed(tmp_path):
    path = _with_zeros(tmp_path / "bomb.npz", _good_members(), "junk.npy", (64 << 20,))   # 256 MiB of zeros

    def refused():
        with pytest.raises(captured.UsageError, match="'junk': not an argument of this op"):
            captured.file_cell(path, "gdn", "decode")
    peak = _peak_of(refused)
    assert peak < 16 << 20, peak


def _store_arrays() -> dict:
    x = tq_inputs(next(c for c in tq_matrix.cells("smoke") if c.op == "store"))
    return {k: x[k] for k in TQ_FILE_KEYS["store"] + TQ_OPTIONAL["store"]}


@pytest.mark.parametrize("family, op, arrays, name, implied_by", [
    ("gdn", "decode", gdn_arrays, "q", "k, v, a, b, state_indices"),
    ("gdn", "decode", gdn_arrays, "state", "v, A_log, a, b, dt_bias"),   # heads (a pool of any size is valid)
    ("turboquant", "decode", tq_arrays, "query", "block_table, seq_lens"),
    ("turboquant", "store", _store_arrays, "key", "value, slot_mapping"),
])
def test_a_huge_member_beside_valid_ones_is_refused_from_the_headers_before_any_data_is_read(
        tmp_path, family, op, arrays, name, implied_by):
    """256 MiB of zeros under a key the op takes, the other members a valid call's: without the checks
    between members it is read whole (the file fits the memory bound)."""
    good = arrays()
    small = good.pop(name)
    rows = (256 << 20) // small[0].nbytes
    huge = (rows, *small.shape[1:])
    if name == "state":
        huge = (small.shape[0], small.shape[1] * ((256 << 20) // small.nbytes), *small.shape[2:])
    path = _with_zeros(tmp_path / "huge.npz", _good_members(good), name + ".npy", huge,
                       np.lib.format.dtype_to_descr(small.dtype))
    words = f"{name}: declared shape {list(huge)}; "

    def refused():
        with pytest.raises(captured.UsageError) as exc:
            captured.file_cell(path, family, op)
        assert words in str(exc.value) and f"{implied_by} imply" in str(exc.value), exc.value
    peak = _peak_of(refused)
    assert peak < 16 << 20, peak


def _reads(monkeypatch) -> list:
    """The member names of every ``tensor_files.read`` call from now on (each call's list, in order)."""
    calls, read = [], tensor_files.read

    def recorded(path, names=None):
        calls.append(sorted(names) if names is not None else None)
        return read(path, names)
    monkeypatch.setattr(tensor_files, "read", recorded)
    return calls


HEADERS = {   # refused from the headers alone: no member's data is read
    "k-head-dim": (_gdn(_set("k", lambda a: a["k"][..., :16])),
                   "k: declared shape [4, 2, 16]; q, state imply [4, 2, 32] (T, H, K)"),
    "k-heads": (_gdn(_set("k", lambda a: a["k"][:, :1])), "q: declared shape [4, 2, 32]; k implies [4, 1, 32]"),
    "value-heads": (_gdn(_set("dt_bias", lambda a: a["dt_bias"][:3])),
                    "dt_bias: declared shape [3]; v, A_log, a, b, state imply [4] (HV)"),
    "not-a-multiple": (_gdn(lambda a: a.update({n: a[n][..., :3] for n in ("a", "b", "A_log", "dt_bias")},
                                               v=a["v"][:, :3], state=a["state"][:, :3])),
                       "v: HV=3 value heads is not a multiple of H=2"),
    "pool-heads": (_gdn(_set("state", lambda a: a["state"][:, :2])),
                   "state: declared shape [5, 2, 32, 32]; v, A_log, a, b, dt_bias imply [5, 4, 32, 32] (S, HV, K, V)"),
    "slots-per-token": (_gdn(_set("state_indices", lambda a: a["state_indices"][:3])),
                        "state_indices: declared shape [3]; q, k, v, a, b imply [4] (T)"),
    "mixed-act": (_gdn(_set("k", lambda a: a["k"].astype(np.float16))), "k: dtype float16, expected bfloat16"),
    "q-rank": (_gdn(_set("q", lambda a: a["q"].reshape(4, 64))),
               "q: declared shape [4, 64]; the other members imply [4, 2, 32] (T, H, K)"),
    "no-offsets": (_varlen(_set("cu_seqlens", lambda a: np.zeros(0, np.int32))),
                   "cu_seqlens: declared shape [0]; state_indices implies ["),
    "decay-tokens": (_varlen(_set("g", lambda a: a["g"][:-1])), "g: declared shape ["),
    "sequences": (_varlen(_set("state_indices", lambda a: np.append(a["state_indices"], -1))),
                  "state_indices: declared shape ["),
    "accepted-rows": (_spec(_set("num_accepted_tokens", lambda a: a["num_accepted_tokens"][:-1])),
                      "num_accepted_tokens: declared shape ["),
    "query-head-size": (_tq(_set("query", lambda a: a["query"][..., :64])), "rotation: declared shape [128, 128]; "
                        "query implies [64, 64] (D, D)"),
    "query-heads": (_tq(_set("query", lambda a: a["query"][:, :15])), "query heads Hq=15 must be a multiple"),
    "table-rows": (_tq(_set("block_table", lambda a: a["block_table"][:1])),
                   "query, seq_lens imply [2, 4] (B, M)"),
    "slot-size": (_tq(_set("kv_cache", lambda a: np.ascontiguousarray(a["kv_cache"][..., :-2]))),
                  "kv_cache: last dimension 132 is no preset's slot size at D=128"),
    "fp8-rotated": (_tq(_set("kv_cache", lambda a: np.zeros((*a["kv_cache"].shape[:3],
                                                             preset("turboquant_k8v4").slot_size(128)), np.uint8))),
                    "rotation: turboquant_k8v4 keys are FP8, not rotated"),
    "key-heads": (_store(_set("key", lambda a: a["key"][:, :1]), {"layout": "aos"}),
                  "key: declared shape [17, 1, 128]; kv_cache, value imply [17, 4, 128] (N, Hk, D)"),
    "slots-per-key": (_store(_set("slot_mapping", lambda a: a["slot_mapping"][:5]), {"layout": "aos"}),
                      "slot_mapping: declared shape [5]; key, value imply [17] (N)"),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_members_that_disagree_are_refused_from_the_headers_before_any_data_is_read(tmp_path, monkeypatch, case):
    make, expected = HEADERS[case]
    where, arrays, strings = make()
    path = capture.save(tmp_path / "bad.npz", arrays, strings)
    reads = _reads(monkeypatch)
    with pytest.raises(captured.UsageError) as exc:
        captured.file_cell(path, *where.split("/"))
    assert expected in str(exc.value) and reads == [], (str(exc.value), reads)


@pytest.mark.parametrize("make, first, expected", [
    (_varlen(_poke("cu_seqlens", -1, lambda a: a["q"].shape[0] + 1)), ["cu_seqlens", "state_indices"],
     "cu_seqlens: expected to start at 0 and end at T="),
    (_gdn(_poke("state_indices", 0, lambda a: a["state"].shape[0])), ["state_indices"],
     "state_indices: slot index out of range [-1, 5)"),
    (_tq(_poke("block_table", (1, 0), lambda a: a["kv_cache"].shape[0]), {"layout": "soa"}),
     ["block_table", "layout", "seq_lens"], "block_table row 1 uses a block outside [0, "),
    (_store(_poke("slot_mapping", 0, lambda a: a["kv_cache"].shape[0] * 16), {"layout": "aos"}),
     ["layout", "slot_mapping"], "slot_mapping entries must be < num_blocks * block_size"),
], ids=["cu_seqlens", "state_indices", "block_table", "slot_mapping"])
def test_the_index_tables_are_read_first_and_one_the_others_contradict_stops_the_read(
        tmp_path, monkeypatch, make, first, expected):
    where, arrays, strings = make()
    path = capture.save(tmp_path / "bad.npz", arrays, strings)
    reads = _reads(monkeypatch)
    with pytest.raises(captured.UsageError, match=re.escape(expected)):
        captured.file_cell(path, *where.split("/"))
    assert reads == [first]


@pytest.mark.parametrize("family, op, arrays", [("gdn", "decode", gdn_arrays), ("turboquant", "decode", tq_arrays)])
def test_a_valid_file_is_read_in_two_parts_the_tables_and_strings_then_the_rest(tmp_path, monkeypatch, family, op,
                                                                                 arrays):
    x = arrays()
    path = capture.save(tmp_path / "layer.npz", x, {"layout": "soa"} if family == "turboquant" else {})
    tables = [n for n in x if n in families.get(family).CAPTURED.TABLES]
    reads = _reads(monkeypatch)
    captured.file_cell(path, family, op)
    assert reads == [sorted(tables + (["layout"] if family == "turboquant" else [])),
                     sorted(n for n in x if n not in tables)]


def _file_members(family: str, op: str, inputs: dict) -> dict:
    module = families.get(family).CAPTURED
    required, optional, _ = module.keys(op)
    return {k: inputs[k] for k in required + optional if inputs.get(k) is not None}


@pytest.mark.parametrize("family", ["gdn", "turboquant"])
def test_every_smoke_cell_of_a_captured_op_passes_the_header_and_table_checks(family):
    module = families.get(family).CAPTURED
    for cell in (c for c in families.get(family).cells("smoke") if c.op in module.OPS):
        x = _file_members(family, cell.op, families.get(family).make_inputs(cell))
        module.check_headers(cell.op, x)
        module.check_tables(cell.op, x, x)


@pytest.mark.parametrize("family", ["gdn", "turboquant"])
def test_a_refusal_row_that_changes_a_shape_is_refused_from_the_headers_naming_its_argument(family):
    """The family's refusal data (``REFUSALS``): a row whose spoiled inputs change a file member's shape is
    refused by ``check_headers`` alone, naming the row's argument."""
    from conformance.refusals import names_argument, spoiled

    fam = families.get(family)
    module, checked = fam.CAPTURED, 0
    for refusal in getattr(fam, "REFUSALS", ()):
        for op in (o for o in refusal.ops if o in module.OPS):
            cell = next(c for c in fam.cells("smoke") if c.op == op)
            x = _file_members(family, op, fam.make_inputs(cell))
            with np.errstate(over="ignore"):   # a spoiled value past a 16-bit activation's range
                bad = _file_members(family, op, spoiled(refusal, x))
            if all(np.shape(bad[k]) == np.shape(x[k]) for k in x):
                continue
            with pytest.raises((ValueError, TypeError)) as exc:
                module.check_headers(op, bad)
            assert names_argument(str(exc.value), refusal.names), (refusal.label, str(exc.value))
            checked += 1
    assert checked or family == "turboquant"   # gdn: "k with one head dimension fewer than q"


def test_a_file_whose_arrays_need_more_than_half_the_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    arrays = gdn_arrays()
    arrays["state"] = np.zeros((4096, *arrays["state"].shape[1:]), arrays["state"].dtype)   # 32 MiB, compresses
    path = capture.save(tmp_path / "big.npz", arrays)
    monkeypatch.setattr(tensor_files, "memory_bytes", lambda: 32 << 20)
    with pytest.raises(tensor_files.TensorFileError, match=r"its arrays need 32.?\d* MiB \(the largest, 'state', 32 MiB\)"
                       r", more than half this machine's memory \(32 MiB\)"):
        tensor_files.read(path)


def test_a_file_read_in_two_parts_is_held_to_the_memory_bound_as_a_whole(tmp_path, monkeypatch):
    arrays = gdn_arrays()
    path = capture.save(tmp_path / "layer.npz", arrays)
    rest = sum(a.nbytes for k, a in arrays.items() if k != "state_indices")
    monkeypatch.setattr(tensor_files, "memory_bytes", lambda: 2 * rest)   # all but the table fits, the whole not
    reads = _reads(monkeypatch)
    with pytest.raises(captured.UsageError, match="more than half this machine's memory"):
        captured.file_cell(path, "gdn", "decode")
    assert reads == []


def test_nan_in_a_pool_slot_the_op_never_touches_passes_and_a_write_there_still_fails(tmp_path):
    arrays = gdn_arrays()
    used = set(arrays["state_indices"][arrays["state_indices"] >= 0].tolist())
    nan_slot = np.full((1, *arrays["state"].shape[1:]), np.nan, np.float32).astype(arrays["state"].dtype)
    arrays["state"] = np.concatenate([arrays["state"], nan_slot])   # a free slot of a server's pool: garbage
    assert arrays["state"].shape[0] - 1 not in used
    cell = captured.file_cell(capture.save(tmp_path / "garbage.npz", arrays), "gdn", "decode")
    for backend in ("numpy-ref", "jax-ref"):
        assert verdict(cell, backend)[0] == "pass"
    # the same check still catches a backend that touches the untouched slots
    from conformance import families

    inputs = captured.load_inputs(cell)
    good = run_one(cell, "numpy-ref", Memo())
    assert good["outputs"]["untouched_slots"]["passed"] is True
    outputs = {"o": np.zeros((4, 4, 32), np.float32), "state": np.array(inputs["state"], copy=True)}
    outputs["state"][-1] = 0
    result = families.get("gdn").check(cell, "exact", inputs, outputs)
    assert not next(c for c in result.comparisons if c.name == "untouched_slots").passed


def test_a_gdn_decode_file_with_float32_parameters_beside_bfloat16_activations_is_its_matrix_cell(tmp_path):
    cell = gdn_matrix.cell_of("decode", dict(state="bfloat16", heads=(4, 12), KV=(64, 64), N=3, decay="strong",
                                             slots="shuffled", qk="unit", act="bfloat16", params="float32"))
    x = gdn_inputs(cell)
    assert x["dt_bias"].dtype == np.float32 and x["q"].dtype.name == "bfloat16"
    file_cell = captured.file_cell(capture.save(tmp_path / "layer.npz", {k: x[k] for k in GDN_KEYS}, {}),
                                   "gdn", "decode")
    assert verdict(file_cell, "numpy-ref") == verdict(cell, "numpy-ref")
    assert verdict(cell, "numpy-ref")[0] == "pass"
