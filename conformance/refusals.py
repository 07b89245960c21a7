"""Refusals as family data: the bad inputs every implementation of an op must refuse, and how.

A family's ``REFUSALS`` is a tuple of ``Refusal`` rows: a label, the ops whose inputs it spoils, how it spoils a
cell's inputs, the exception type, and the argument the message must name. One generic test
(tests/unit/test_refusals.py) runs every row against every registered backend of the family that holds the
argument contract (``Backend.argument_contract``: the references, our C++, Triton and torch kernels; not the
peers, whose arguments are their own): the call must raise that type, name that argument, and leave the
pool it would write (the family's ``POOL`` input) as it was, bit for bit. A new backend gets every row by
being registered.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Refusal:
    """One bad input: ``spoil(inputs)`` changes a private copy of a cell's inputs (the family's dict) so that
    every op of ``ops`` must raise ``error`` (a type, or a tuple of types) with a message naming ``names``."""
    label: str
    ops: tuple[str, ...]
    spoil: Callable[[dict], None]
    error: type | tuple
    names: str


def spoiled(refusal: Refusal, inputs: dict) -> dict:
    """A deep copy of ``inputs`` with ``refusal`` applied."""
    out = copy.deepcopy(dict(inputs))
    refusal.spoil(out)
    return out


def names_argument(message: str, name: str) -> bool:
    """Whether ``message`` names the argument ``name`` as a word (``a`` in "A_log, a, dt_bias: ...", not in "way")."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) is not None


def problem(refusal: Refusal, run: Callable[[dict], object], inputs: dict, pool: str) -> str | None:
    """Run ``run`` on the spoiled ``inputs``; None when it raised ``refusal.error`` naming ``refusal.names`` and left
    ``inputs[pool]`` (when the op has one) as it was, else what went wrong, in words."""
    bad = spoiled(refusal, inputs)
    before = np.array(bad[pool], copy=True) if pool in bad else None
    try:
        run(bad)
    except refusal.error as exc:
        message = str(exc)
        if not names_argument(message, refusal.names):
            return f"raised {type(exc).__name__} without naming {refusal.names!r}: {message}"
    except Exception as exc:  # noqa: BLE001  (any other exception is the answer we report)
        return f"raised {type(exc).__name__}, expected {refusal.error}: {exc}"
    else:
        return "accepted it"
    if before is not None and not np.array_equal(before.view(np.uint8), np.asarray(bad[pool]).view(np.uint8)):
        return f"refused it, but wrote into {pool}"
    return None


# ---------------------------------------------------------------- spoilers the families' tables share

def set_entry(name: str, value, index=(0,)) -> Callable[[dict], None]:
    """A spoiler: ``inputs[name][index] = value`` on a copy of that array."""
    def spoil(x: dict) -> None:
        arr = np.array(x[name])
        arr[index] = value
        x[name] = arr
    return spoil


def replace(name: str, value: Callable[[dict], object]) -> Callable[[dict], None]:
    """A spoiler: ``inputs[name] = value(inputs)``."""
    def spoil(x: dict) -> None:
        x[name] = value(x)
    return spoil


def both(*spoils: Callable[[dict], None]) -> Callable[[dict], None]:
    """A spoiler applying each of ``spoils`` in turn."""
    def spoil(x: dict) -> None:
        for s in spoils:
            s(x)
    return spoil
