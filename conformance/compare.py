"""Error metrics, tolerances and the pass/fail verdict of one cell.

Every comparison reports max_abs, max_rel, rel_l2, cosine, the mismatch fraction (elements with
``|a - e| > atol + rtol * |e|``), ``elementwise`` (``max |a - e| / (atol + rtol * |e|)``) and the
``margin``: the largest ratio of a measured error to its bound over every criterion the tolerance
has, named in ``criterion``:

- ``elementwise``: the ratio above, when no element may be outside (``max_mismatch`` 0) or none is;
- ``mismatch``: the mismatch fraction over ``max_mismatch``, when some elements may be and are outside;
- ``rel_l2``: the relative L2 error over its bound, when the tolerance has one;
- ``nonfinite``: NaN or Inf in the output or the oracle (margin Inf).

A comparison passes exactly when its margin is at most 1, so a failure always has margin >= 1 (a
refusal without metrics, e.g. a wrong dtype or shape, has margin Inf). NaN or Inf never passes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
import math
from typing import Any, Callable, Iterable

import numpy as np

from conformance.numerics import l2_metrics


@dataclass(frozen=True)
class Tolerance:
    """Elementwise bound ``atol + rtol * |expected|``; ``max_mismatch`` is the fraction of
    elements allowed outside it (0 by default); ``rel_l2`` an optional bound on the relative
    L2 error. ``source`` says where the numbers come from (a rounding argument, not a guess);
    ``terms`` names the tolerance terms (``ToleranceSpec.name``) it adds up, in the order they were
    applied."""

    atol: float
    rtol: float
    source: str
    max_mismatch: float = 0.0
    rel_l2: float | None = None
    terms: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "terms": list(self.terms)}

    def between_two(self) -> "Tolerance":
        """The bound between two results that are each within this one of the same oracle
        (triangle inequality: every bound doubled)."""
        return Tolerance(2 * self.atol, 2 * self.rtol, f"two results each within: {self.source}",
                         min(1.0, 2 * self.max_mismatch), None if self.rel_l2 is None else 2 * self.rel_l2,
                         self.terms)

    def term(self, spec: "ToleranceSpec", note: str = "", **values) -> "Tolerance":
        """This tolerance with ``values`` (atol, rtol, rel_l2, max_mismatch) set by the term ``spec``:
        its name appended to ``terms``, and to ``source`` with ``note`` (the figures it used)."""
        said = f"{spec.name} ({note})" if note else spec.name
        return replace(self, **values, source=f"{self.source}; {said}" if self.source else said,
                       terms=self.terms + (spec.name,))


EXACT = Tolerance(0.0, 0.0, "bit-exact: same integer codes / bytes expected")


@dataclass(frozen=True)
class ToleranceSpec:
    """One tolerance term of a family as data a reviewer reads on one screen.

    name:     the term's name (``<family>.<what>``), recorded in every verdict's tolerance (``terms``).
    bound:    the bound as a formula (written from the same constants as ``apply``).
    argument: the rounding argument it comes from.
    caught:   names of the planted bugs (``conformance.testing.PLANTED``) shown to exceed it.
    apply:    the formula, ``apply(figures, accumulated) -> accumulated``: what the term adds to the
              tolerance the terms before it built (``fold``), from the cell's ``figures`` (a family's
              record of what its terms read); None for a tolerance that stands alone.
    """

    name: str
    bound: str
    argument: str
    caught: tuple[str, ...]
    apply: Callable[[Any, Any], Any] | None = None


def fold(terms: Iterable[ToleranceSpec], figures: Any, start: Any) -> Any:
    """Apply ``terms`` in order to ``start``: each one's ``apply(figures, accumulated)``."""
    for spec in terms:
        start = spec.apply(figures, start)
    return start


@dataclass
class Comparison:
    """One output's verdict; ``metrics["criterion"]`` names the criterion that set ``margin``."""

    name: str
    passed: bool
    reason: str
    metrics: dict[str, Any]
    tolerance: Tolerance

    def __post_init__(self):
        # a failure decided without metrics (dtype, shape, a refused layout) is infinitely far out
        margin = self.metrics.get("margin")
        if not self.passed and not (isinstance(margin, float | int) and margin >= 1):
            self.metrics = {**self.metrics, "margin": float("inf"), "criterion": "refused"}


def dtype_refused(name: str, actual: Any, allowed: tuple[str, ...]) -> Comparison | None:
    """A failing comparison naming ``actual``'s dtype unless it is one of ``allowed`` (None then)."""
    got = np.asarray(actual).dtype.name
    if got in allowed:
        return None
    return Comparison(name, False, f"{name}: dtype {got}, expected {' or '.join(dict.fromkeys(allowed))}",
                      {"max_abs": float("inf")}, EXACT)


def compare(name: str, actual: Any, expected: Any, tol: Tolerance) -> Comparison:
    """Compare one output against its oracle under ``tol``."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    if a.shape != e.shape:
        return Comparison(name, False, f"{name}: shape {a.shape}, expected {e.shape}",
                          {"max_abs": float("inf"), "margin": float("inf"), "criterion": "shape"}, tol)
    n = max(a.size, 1)
    bad_actual = int(np.count_nonzero(~np.isfinite(a)))
    bad_expected = int(np.count_nonzero(~np.isfinite(e)))
    diff = np.abs(a - e)
    allowed = tol.atol + tol.rtol * np.abs(e)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(np.abs(e) > 0, diff / np.abs(e), np.where(diff > 0, np.inf, 0.0))
        over = np.where(allowed > 0, diff / allowed, np.where(diff > 0, np.inf, 0.0))
    finite = np.isfinite(diff)
    rel_l2, cosine = l2_metrics(a, e)
    mismatch = int(np.count_nonzero(~finite | (diff > allowed)))
    elementwise = float(np.max(over[finite])) if finite.any() else float("inf")
    criteria = _criteria(tol, elementwise, mismatch / n, rel_l2, bad_actual + bad_expected)
    criterion = max(criteria, key=criteria.get)
    metrics = {
        "max_abs": float(np.max(diff[finite])) if finite.any() else float("inf"),
        "max_rel": float(np.max(rel[finite])) if finite.any() else float("inf"),
        "rel_l2": rel_l2,
        "cosine": cosine,
        "mismatch": mismatch / n,
        "elementwise": elementwise,
        "margin": criteria[criterion],
        "criterion": criterion,
        "nonfinite": bad_actual,
        "size": int(a.size),
    }
    if bad_expected:
        return Comparison(name, False, f"{name}: oracle has {bad_expected} NaN/Inf values", metrics, tol)
    if bad_actual:
        return Comparison(name, False, f"{name}: {bad_actual} NaN/Inf values", metrics, tol)
    if mismatch / n > tol.max_mismatch:
        return Comparison(
            name, False,
            f"{name}: {mismatch}/{a.size} elements beyond atol {tol.atol:g} + rtol {tol.rtol:g}"
            f" (margin {metrics['margin']:.3g} by {criterion}, max_abs {metrics['max_abs']:.3g})",
            metrics, tol)
    if tol.rel_l2 is not None and rel_l2 > tol.rel_l2:
        return Comparison(name, False, f"{name}: rel_l2 {rel_l2:.3g} above {tol.rel_l2:g}"
                          f" (margin {metrics['margin']:.3g} by {criterion})", metrics, tol)
    return Comparison(name, True, "", metrics, tol)


def _ratio(value: float, bound: float) -> float:
    if bound > 0:
        return value / bound
    return 0.0 if value == 0 else float("inf")


def _criteria(tol: Tolerance, elementwise: float, mismatch: float, rel_l2: float, nonfinite: int) -> dict[str, float]:
    """Criterion name -> measured error / its bound (see the module docstring); the comparison
    passes exactly when every ratio is at most 1."""
    out = {}
    if tol.max_mismatch > 0 and mismatch > 0:
        out["mismatch"] = _ratio(mismatch, tol.max_mismatch)
    else:
        out["elementwise"] = elementwise
    if tol.rel_l2 is not None:
        out["rel_l2"] = _ratio(rel_l2, tol.rel_l2) if math.isfinite(rel_l2) else float("inf")
    if nonfinite:
        out["nonfinite"] = float("inf")
    return out


FINITE = Tolerance(float("inf"), 0.0, "any finite value: unspecified elements, but never NaN/Inf")


def finite(name: str, actual: Any) -> Comparison:
    """Elements whose value is unspecified (e.g. output rows of padding sequences): any finite
    value passes, NaN or Inf fails."""
    a = np.asarray(actual).astype(np.float64)
    bad = int(np.count_nonzero(~np.isfinite(a)))
    metrics = {"margin": 0.0 if not bad else float("inf"), "nonfinite": bad, "size": int(a.size)}
    if bad:
        return Comparison(name, False, f"{name}: {bad} NaN/Inf values", metrics, FINITE)
    return Comparison(name, True, "", metrics, FINITE)


def identical(name: str, actual: Any, expected: Any, tol: Tolerance) -> Comparison:
    """Elements the op never touches (e.g. pool slots no sequence writes): each keeps its bits, compared
    as float32 (exact for float32, bfloat16 and float16), a NaN matching a NaN of any payload. Not
    through a tolerance: garbage in a slot no one reads (NaN, Inf) passes when left as it was."""
    a = np.asarray(actual).astype(np.float32)
    e = np.asarray(expected).astype(np.float32)
    if a.shape != e.shape:
        return Comparison(name, False, f"{name}: shape {a.shape}, expected {e.shape}",
                          {"max_abs": float("inf"), "margin": float("inf"), "criterion": "shape"}, tol)
    kept = (a.view(np.uint32) == e.view(np.uint32)) | (np.isnan(a) & np.isnan(e))
    changed = int(a.size - np.count_nonzero(kept))
    metrics = {"mismatch": changed / max(a.size, 1), "margin": float("inf") if changed else 0.0,
               "criterion": "mismatch" if changed else "elementwise", "size": int(a.size)}
    if changed:
        return Comparison(name, False, f"{name}: {changed}/{a.size} elements changed (expected bit-identical)",
                          metrics, tol)
    return Comparison(name, True, "", metrics, tol)


@dataclass
class Verdict:
    """Outcome of one cell on one backend, before the runner adds ids and timing."""

    status: str  # "pass" or "fail"
    reason: str
    comparisons: list[Comparison]
    quality: dict[str, Any] = field(default_factory=dict)

    def worst(self) -> Comparison | None:
        """The deciding comparison: a failing one before a passing one, then the largest margin."""
        if not self.comparisons:
            return None
        return max(self.comparisons, key=lambda c: (not c.passed, c.metrics.get("margin", 0.0)))


def verdict(comparisons: list[Comparison], quality: dict[str, Any] | None = None) -> Verdict:
    """``pass`` when every comparison passes; the reason lists the failing ones."""
    failed = [c for c in comparisons if not c.passed]
    if failed:
        return Verdict("fail", "; ".join(c.reason for c in failed), comparisons, quality or {})
    return Verdict("pass", "", comparisons, quality or {})
