"""Files of named tensors: ``.npz`` (NumPy) and ``.safetensors``, read as NumPy arrays plus a few
named strings (the metadata), and written from them.

- ``.npz``: each array under its name; a string is a 0-d unicode array. NumPy stores an ml_dtypes
  bfloat16 array as 2-byte void (``V2``): a ``V2`` array is listed and read back as bfloat16. Object arrays
  (pickles) are refused.
- ``.safetensors``: the tensors under their names (BF16 as ml_dtypes bfloat16), the strings in the
  header's ``__metadata__``; read and written by the ``safetensors`` package.

``listing`` gives each tensor's shape and dtype from the headers alone (nothing decompressed), so a
caller checks names and sizes before any data is read; ``read`` reads the data of all members or of those
named (a caller reads the small ones first and checks the big ones against them), at most the bytes the
headers declare. Both raise ``TensorFileError`` naming the file, the member and what is wrong: a
member that is not ``.npy``, a header declaring a negative dimension or more data than the member
holds (truncated or forged), an object array (a pickle), a member cut short, more memory than this
machine has.
"""
from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import ml_dtypes
import numpy as np

from conformance.errors import UsageError, needs, shown

SUFFIXES = (".npz", ".safetensors")


class TensorFileError(UsageError):
    """A tensor file that cannot be read (missing, not a file, of an unknown suffix, corrupt)."""


def suffix(path: str | os.PathLike) -> str:
    """``.npz`` or ``.safetensors``; TensorFileError for any other suffix."""
    s = Path(path).suffix.lower()
    if s not in SUFFIXES:
        raise TensorFileError(f"{path}: expected a .npz or .safetensors file, got suffix {s or '(none)'!r}")
    return s


def existing(path: str | os.PathLike) -> Path:
    """``path`` when it is a regular file of a known suffix; TensorFileError otherwise (a FIFO or
    device is refused before it is opened: reading it could wait forever)."""
    p = Path(path)
    suffix(p)
    if not p.is_file():
        raise TensorFileError(f"{p}: {'is not a regular file' if p.exists() else 'no such file'}")
    return p


@dataclass(frozen=True)
class Member:
    """One tensor of a file as its header declares it: shape, dtype and the bytes its data takes."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def is_string(self) -> bool:
        return self.dtype.kind == "U" and self.shape == ()


def size_text(nbytes: int) -> str:
    """``nbytes`` in B, KiB ... EiB, three digits."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024:
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    return f"{nbytes:.3g} EiB"


def memory_bytes() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _npz_header(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[str, Member]:
    where = f"{path}: member {shown(info.filename)}"
    if not info.filename.endswith(".npy"):
        raise TensorFileError(f"{where} is not a .npy array (an .npz holds .npy members only)")
    try:
        with zf.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise TensorFileError(f"{where}: .npy format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
            shape, _, dtype = read_header(fh)
            header_bytes = fh.tell()
    except (ValueError, EOFError) as exc:
        raise TensorFileError(f"{where}: not a valid .npy header ({exc})") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise TensorFileError(f"{where}: cannot be read ({exc})") from None
    if dtype.hasobject:
        raise TensorFileError(f"{where}: holds an object array (a pickle); expected plain arrays")
    if any(d < 0 for d in shape):
        raise TensorFileError(f"{where}: its header declares shape {list(shape)}, a negative dimension")
    member = Member(tuple(shape), np.dtype(ml_dtypes.bfloat16) if dtype == np.dtype("V2") else dtype)
    held = info.file_size - header_bytes
    if member.nbytes > held:
        raise TensorFileError(f"{where}: its header declares shape {list(shape)} of {dtype.name} "
                              f"({size_text(member.nbytes)}) but the member holds {size_text(max(held, 0))} of data "
                              "(truncated or forged)")
    return info.filename[:-4], member


def _npz_listing(path: Path) -> dict[str, Member]:
    if not zipfile.is_zipfile(path):
        raise TensorFileError(f"{path}: not a readable .npz file (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            return dict(_npz_header(path, zf, info) for info in zf.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise TensorFileError(f"{path}: not a readable .npz file ({exc})") from None


def _read_npz(path: Path, listed: dict[str, Member]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays, strings = {}, {}
    with zipfile.ZipFile(path) as zf:
        for name, member in listed.items():
            where = f"{path}: member {shown(name + '.npy')}"
            try:
                with zf.open(name + ".npy") as fh:
                    a = np.lib.format.read_array(fh, allow_pickle=False)
            except MemoryError:
                raise TensorFileError(f"{where}: its {size_text(member.nbytes)} do not fit in memory here") from None
            except (ValueError, EOFError) as exc:
                raise TensorFileError(f"{where}: cut short or corrupt ({exc})") from None
            except (zipfile.BadZipFile, OSError) as exc:
                raise TensorFileError(f"{where}: cannot be read ({exc})") from None
            if member.is_string:
                strings[name] = str(a)
            elif a.dtype == np.dtype("V2"):
                arrays[name] = a.view(ml_dtypes.bfloat16)
            else:
                arrays[name] = a
    return arrays, strings


_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64,
                       "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}


def _safetensors_listing(path: Path) -> dict[str, Member]:
    needs(f"reading {path}", "safetensors", "safetensors")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            out = {}
            for name in f.keys():
                part = f.get_slice(name)
                if part.get_dtype() not in _SAFETENSORS_DTYPES:
                    raise TensorFileError(f"{path}: tensor {shown(name)} has dtype {part.get_dtype()}; expected one "
                                          f"of {', '.join(_SAFETENSORS_DTYPES)}")
                out[name] = Member(tuple(part.get_shape()), np.dtype(_SAFETENSORS_DTYPES[part.get_dtype()]))
            out.update({name: Member((), np.dtype("U1")) for name in (f.metadata() or {})})
            return out
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise TensorFileError(f"{path}: not a readable .safetensors file ({exc})") from None


def _read_safetensors(path: Path, listed: dict[str, Member]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    needs(f"reading {path}", "safetensors", "safetensors")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            strings = {k: v for k, v in (f.metadata() or {}).items() if k in listed}
            return {name: f.get_tensor(name) for name in listed if name not in strings}, strings
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise TensorFileError(f"{path}: not a readable .safetensors file ({exc})") from None


def listing(path: str | os.PathLike) -> dict[str, Member]:
    """Each tensor's (or string's) name and ``Member`` from the file's headers, no data read."""
    p = existing(path)
    return _npz_listing(p) if suffix(p) == ".npz" else _safetensors_listing(p)


def check_memory(path: str | os.PathLike, listed: Mapping[str, Member]) -> int:
    """The bytes ``listed`` (members of the file at ``path``) need; TensorFileError naming the largest when
    that is more than half this machine's memory."""
    need = sum(m.nbytes for m in listed.values())
    if need > memory_bytes() // 2:
        biggest = max(listed, key=lambda n: listed[n].nbytes)
        raise TensorFileError(f"{path}: its arrays need {size_text(need)} (the largest, {shown(biggest)}, "
                              f"{size_text(listed[biggest].nbytes)}), more than half this machine's memory "
                              f"({size_text(memory_bytes())})")
    return need


def read(path: str | os.PathLike, names: Iterable[str] | None = None
         ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays by name, strings by name) of a ``.npz`` or ``.safetensors`` file: every member, or those of
    ``names`` (each a member of the file); refused before any data is read when the arrays to read need more
    than half this machine's memory (``check_memory``)."""
    p = existing(path)
    listed = listing(p)
    if names is not None:
        names = list(names)
        absent = [n for n in names if n not in listed]
        if absent:
            raise TensorFileError(f"{p}: holds no member {', '.join(map(shown, absent))}")
        listed = {n: listed[n] for n in names}
    need = check_memory(p, listed)
    try:
        return _read_npz(p, listed) if suffix(p) == ".npz" else _read_safetensors(p, listed)
    except MemoryError:
        raise TensorFileError(f"{p}: its arrays ({size_text(need)}) do not fit in memory here") from None


def write(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], strings: Mapping[str, str] | None = None
          ) -> Path:
    """Write ``arrays`` (NumPy, ml_dtypes bfloat16 included) and ``strings`` to ``path`` (by its suffix);
    ValueError when a name is used twice or a string is not a str."""
    p = Path(path)
    kind = suffix(p)
    strings = dict(strings or {})
    both = sorted(set(arrays) & set(strings))
    if both:
        raise ValueError(f"names used both for an array and a string: {', '.join(both)}")
    bad = [k for k, v in strings.items() if not isinstance(v, str)]
    if bad:
        raise ValueError(f"strings: expected str values, got {', '.join(f'{k}={strings[k]!r}' for k in bad)}")
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    if kind == ".npz":
        np.savez(p, **arrays, **{k: np.array(v) for k, v in strings.items()})
    else:
        needs(f"writing {p}", "safetensors", "safetensors")
        from safetensors.numpy import save_file

        save_file(arrays, str(p), metadata=strings or None)
    return p
