"""Cells whose inputs come from a file (``kernel-lab conform --inputs FILE --family F --op OP``): the
tensors a layer was called with in a real model, keyed by the reference's argument names (read by
``conformance.inputs.tensor_files``: ``.npz`` or ``.safetensors``).

A family takes files for the ops its ``CAPTURED`` module (a member of the family protocol,
``conformance.families``) lists in ``OPS``. What is read is bounded by what the op takes, in this order:
that module's ``keys(op) -> (required, optional, strings)`` names what a file may hold and
``check_headers(op, members)`` checks the members' shapes and dtypes against each other, both from the
file's headers before any data is read (an unexpected member is refused, never decompressed; a member
larger than the others imply, never read; a file needing more than half the memory, never read); then
the strings and the index tables (``TABLES``, small) are read and ``check_tables(op, members, tables)`` checks their values against the other members' shapes;
then the rest is read, and ``derive(op, arrays, strings) -> (params, inputs)`` checks the file
strictly (``InputsError`` naming the key and what was expected) and gives the cell's parameters,
read from the arrays' shapes and dtypes, and the family's input dict. The cell is a matrix cell of
those parameters plus ``inputs=<the first 12 hex digits of the file's SHA-256>``; it keeps the file's
path (``Cell.source``), from which every worker reads the inputs again, refusing a file whose digest
has changed. The family's oracle, tolerances and check judge it as any other cell.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from types import ModuleType

from conformance import families
from conformance.cells import Cell, make_cell
from conformance.errors import UsageError
from conformance.inputs import tensor_files
from conformance.inputs.checks import check_keys

DIGEST_CHARS = 12   # of the SHA-256 in the cell id (``inputs=``)


def _module(family: str) -> ModuleType | None:
    """The family's ``CAPTURED`` module (``conformance.families``), or None when it takes no file."""
    return getattr(families.get(family), "CAPTURED", None)


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
    listed = tensor_files.listing(path)
    members = {n: m for n, m in listed.items() if not m.is_string}
    first = [n for n, m in listed.items() if m.is_string or n in mod.TABLES]
    try:
        check_keys(members, {n: m for n, m in listed.items() if m.is_string}, *mod.keys(op))
        mod.check_headers(op, members)
        tensor_files.check_memory(path, listed)   # the whole file, read in two parts
        tables, strings = tensor_files.read(path, first)
        mod.check_tables(op, members, tables)
        rest, _ = tensor_files.read(path, [n for n in members if n not in tables])
        return mod.derive(op, {**tables, **rest}, strings)
    except UsageError:   # the file itself (tensor_files.TensorFileError) names it
        raise
    except (ValueError, TypeError) as exc:
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
