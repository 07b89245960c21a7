"""Cells whose inputs come from a file (``kernel-lab conform --inputs FILE --family F --op OP``): the
tensors a layer was called with in a real model, keyed by the reference's argument names (read by
``conformance.inputs.tensor_files``: ``.npz`` or ``.safetensors``).

A family takes files for the ops its ``captured`` module (``conformance.families.<family>.captured``)
lists in ``OPS``; that module's ``derive(op, arrays, strings) -> (params, inputs)`` checks the file
strictly (``InputsError`` naming the key and what was expected) and gives the cell's parameters,
read from the arrays' shapes and dtypes, and the family's input dict. The cell is a matrix cell of
those parameters plus ``inputs=<the first 12 hex digits of the file's SHA-256>``; it keeps the file's
path (``Cell.source``), from which every worker reads the inputs again, refusing a file whose digest
has changed. The family's oracle, tolerances and check judge it as any other cell.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Iterable, Mapping

import numpy as np

from conformance import families
from conformance.inputs import tensor_files
from conformance.cells import Cell, make_cell
from conformance.errors import UsageError

DIGEST_CHARS = 12   # of the SHA-256 in the cell id (``inputs=``)


class InputsError(ValueError):
    """A file's tensors that do not make the op's inputs: the message names the key."""


def _module(family: str) -> ModuleType | None:
    """The family's ``captured`` module, or None when it has none."""
    name = f"{families.get(family).__name__}.captured"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def supported() -> list[str]:
    """``family/op`` of every op that takes a file."""
    out = []
    for name in families.families():
        mod = _module(name)
        out += [f"{name}/{op}" for op in (mod.OPS if mod else ())]
    return out


def sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a tensor file's bytes (TensorFileError naming it when it cannot be read)."""
    h = hashlib.sha256()
    try:
        with open(tensor_files.existing(path), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise tensor_files.TensorFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return h.hexdigest()


def _derive(path: str | os.PathLike, family: str, op: str) -> tuple[dict, dict]:
    mod = _module(family)
    if mod is None or op not in mod.OPS:
        raise UsageError(f"--inputs: {family}/{op} does not take a file; supported: {', '.join(supported())}")
    arrays, strings = tensor_files.read(path)
    try:
        return mod.derive(op, arrays, strings)
    except (InputsError, ValueError, TypeError) as exc:
        raise UsageError(f"--inputs {path}: {exc}") from None


def file_cell(path: str | os.PathLike, family: str, op: str, digest: str | None = None) -> Cell:
    """The cell of the file's tensors as inputs of ``family``/``op`` (UsageError naming the file and
    the key when they are not). ``digest``: the SHA-256 the file must still have."""
    now = sha256(path)
    if digest is not None and now != digest:
        raise UsageError(f"--inputs {path}: changed while being read (sha256 {digest[:DIGEST_CHARS]}, "
                         f"now {now[:DIGEST_CHARS]})")
    params, _ = _derive(path, family, op)
    cell = make_cell(family, op, **params, inputs=now[:DIGEST_CHARS])
    return dataclasses.replace(cell, source=str(Path(path).resolve()))


def load_inputs(cell: Cell) -> dict:
    """The family's inputs of a file cell, read from ``cell.source``; ValueError when the file's
    digest is no longer the cell's (the file changed since the run began)."""
    now = sha256(cell.source)[:DIGEST_CHARS]
    if now != cell["inputs"]:
        raise ValueError(f"{cell.source}: changed since the run began (sha256 {cell['inputs']}, now {now}); "
                         "run it again into a new --out")
    return _derive(cell.source, cell.family, cell.op)[1]


# ---------------------------------------------------------------- checks the families' derive() share

def check_keys(arrays: Mapping, strings: Mapping, required: Iterable[str], optional: Iterable[str] = (),
               optional_strings: Iterable[str] = ()) -> None:
    """InputsError for a missing array key (saying so when it came as a string) and for an array or
    string key not expected."""
    required, optional, optional_strings = tuple(required), tuple(optional), tuple(optional_strings)
    for name in required:
        if name not in arrays:
            where = " (found as a string)" if name in strings else ""
            raise InputsError(f"{name}: missing{where}; expected arrays {', '.join(required)}"
                              + (f" (optional: {', '.join(optional)})" if optional else ""))
    extra = sorted(set(arrays) - set(required) - set(optional))
    if extra:
        raise InputsError(f"{', '.join(extra)}: not an argument of this op; expected arrays "
                          f"{', '.join(required + optional)}")
    extra = sorted(set(strings) - set(optional_strings))
    if extra:
        known = f"expected strings: {', '.join(optional_strings)}" if optional_strings else "expected none"
        raise InputsError(f"{', '.join(extra)}: an unexpected string; {known}")


def dtype_in(name: str, a: np.ndarray, allowed: Iterable[str], what: str = "") -> str:
    """The dtype name of ``a``, or InputsError naming ``name`` unless it is one of ``allowed``."""
    allowed = tuple(allowed)
    if a.dtype.name not in allowed:
        raise InputsError(f"{name}: dtype {a.dtype.name}, expected {' or '.join(allowed)}{what}")
    return a.dtype.name


def index_table(name: str, a: np.ndarray, dtype) -> np.ndarray:
    """An int32 or int64 index array as ``dtype`` (np.int32 or np.int64; InputsError naming it for
    another dtype or values outside ``dtype``)."""
    dtype_in(name, a, ("int32", "int64"))
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise InputsError(f"{name}: entries outside the {np.dtype(dtype).name} range")
    return a.astype(dtype)
