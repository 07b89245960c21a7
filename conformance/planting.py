"""What planted bugs are made of: the ``PlantedBug`` record, ``Wrapped`` (an implementation with
some of its functions replaced) and the conversions more than one family plants. Each family's
bugs are in its package (``conformance.families.<family>.planted``); ``conformance.testing``
collects them into ``PLANTED``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import ml_dtypes
import numpy as np

from conformance.cells import Cell


@dataclass(frozen=True)
class PlantedBug:
    """name: ``<family>.<what>``; doc: the bug in words; applies: the cells where it can show;
    plant: ``plant(impl) -> impl`` with the bug."""

    name: str
    family: str
    doc: str
    applies: Callable[[Cell], bool]
    plant: Callable[[Any], Any]


class Wrapped:
    """``impl`` with some of its functions replaced (the rest pass through)."""

    def __init__(self, impl, **replaced):
        self._impl = impl
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._impl, name)


def fp16_as_bf16(x):
    """A float16 array silently converted to bf16; anything else unchanged."""
    if getattr(x, "dtype", None) == np.float16:
        return np.asarray(x).astype(ml_dtypes.bfloat16)
    return x
