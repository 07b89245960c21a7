"""The result of a family op's cost model (``conformance/families/<family>/cost.py``): bytes moved
and FLOPs of one call at a shape. Bytes count what the op must read and write at least once;
FLOPs count a multiply-add as two."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    bytes: int
    flops: int
