"""Pairwise covering sets: every pair of values of any two axes meets in at least one row.

A tier is not the cross product of its axes (tens of thousands of cells); it is a covering set
plus named corner cases. The construction is greedy and deterministic (same axes, same rows).
``valid(partial)`` receives a partial assignment (a dict of the axes chosen so far) and rejects
combinations that cannot exist (e.g. spec-decode parameters on a chunked op); a pair that no
valid row can hold is dropped, not looped on.
"""
from __future__ import annotations

from itertools import combinations
from typing import Any, Callable, Mapping, Sequence


def _pairs(names: Sequence[str], axes: Mapping[str, Sequence[Any]]) -> list[tuple]:
    out = []
    for a, b in combinations(range(len(names)), 2):
        for i in range(len(axes[names[a]])):
            for j in range(len(axes[names[b]])):
                out.append((a, i, b, j))
    return out


def pairwise(axes: Mapping[str, Sequence[Any]],
             valid: Callable[[dict], bool] = lambda combo: True) -> list[dict]:
    """Rows (dicts axis -> value, in ``axes`` order) covering every valid pair of values."""
    names = list(axes)
    if any(len(axes[n]) == 0 for n in names):
        raise ValueError("pairwise: every axis needs at least one value")
    if len(names) == 1:
        return [{names[0]: v} for v in axes[names[0]] if valid({names[0]: v})]
    uncovered = set(_pairs(names, axes))
    order = _pairs(names, axes)  # deterministic seed order
    rows: list[dict] = []
    while uncovered:
        seed = next(p for p in order if p in uncovered)
        a, i, b, j = seed
        chosen: dict[int, int] = {a: i, b: j}
        if not valid({names[a]: axes[names[a]][i], names[b]: axes[names[b]][j]}):
            uncovered.discard(seed)
            continue
        feasible = True
        for axis in range(len(names)):
            if axis in chosen:
                continue
            best, best_gain = None, -1
            for vi in range(len(axes[names[axis]])):
                trial = {**chosen, axis: vi}
                partial = {names[x]: axes[names[x]][trial[x]] for x in sorted(trial)}
                if not valid(partial):
                    continue
                gain = sum(1 for x, xv in chosen.items()
                           if (min(x, axis), xv if x < axis else vi, max(x, axis),
                               vi if x < axis else xv) in uncovered)
                if gain > best_gain:
                    best, best_gain = vi, gain
            if best is None:
                feasible = False
                break
            chosen[axis] = best
        if not feasible:
            uncovered.discard(seed)
            continue
        for x, y in combinations(sorted(chosen), 2):
            uncovered.discard((x, chosen[x], y, chosen[y]))
        rows.append({names[x]: axes[names[x]][chosen[x]] for x in range(len(names))})
    return rows


def uncovered_pairs(rows: Sequence[Mapping[str, Any]], axes: Mapping[str, Sequence[Any]]) -> list:
    """Pairs of (axis, value) that no row holds (for tests and for `list-cells --check`)."""
    names = list(axes)
    seen = set()
    for row in rows:
        for a, b in combinations(names, 2):
            seen.add((a, repr(row[a]), b, repr(row[b])))
    missing = []
    for a, b in combinations(names, 2):
        for va in axes[a]:
            for vb in axes[b]:
                if (a, repr(va), b, repr(vb)) not in seen:
                    missing.append(((a, va), (b, vb)))
    return missing
