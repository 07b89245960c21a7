"""Files of named tensors: ``.npz`` (NumPy) and ``.safetensors``, read as NumPy arrays plus a few
named strings (the metadata), and written from them.

- ``.npz``: each array under its name; a string is a 0-d unicode array. NumPy stores an ml_dtypes
  bfloat16 array as 2-byte void (``V2``): a ``V2`` array is read back as bfloat16. Object arrays
  (pickles) are refused.
- ``.safetensors``: the tensors under their names (BF16 as ml_dtypes bfloat16), the strings in the
  header's ``__metadata__``; read and written by the ``safetensors`` package.

``read`` raises ``TensorFileError`` naming the file and what is wrong with it.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Mapping

import ml_dtypes
import numpy as np

from conformance.errors import UsageError, needs

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


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays, strings = {}, {}
    if not zipfile.is_zipfile(path):
        raise TensorFileError(f"{path}: not a readable .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as z:
            for name in z.files:
                a = z[name]
                if a.dtype.kind == "U" and a.ndim == 0:
                    strings[name] = str(a)
                elif a.dtype == np.dtype("V2"):
                    arrays[name] = a.view(ml_dtypes.bfloat16)
                else:
                    arrays[name] = a
    except ValueError:   # an object array asks for pickle
        raise TensorFileError(f"{path}: holds an object array (a pickle); expected plain arrays") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise TensorFileError(f"{path}: not a readable .npz file ({exc})") from None
    return arrays, strings


def _read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    needs(f"reading {path}", "safetensors", "safetensors")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise TensorFileError(f"{path}: not a readable .safetensors file ({exc})") from None


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays by name, strings by name) of a ``.npz`` or ``.safetensors`` file."""
    p = existing(path)
    return _read_npz(p) if suffix(p) == ".npz" else _read_safetensors(p)


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
