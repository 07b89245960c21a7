"""The verdicts of a relation between runs (``conformance.relations`` for GDN,
``conformance.turboquant_relations``), best first, and the worst of several."""
from __future__ import annotations

VERDICTS = ("bitwise", "within bound", "not", "n/a")      # best first; "n/a" never outranks a result


def worst(verdicts) -> str:
    """The worst of some verdicts ("n/a" only when there is nothing else)."""
    found = [v for v in verdicts if v != "n/a"]
    return max(found, key=VERDICTS.index) if found else "n/a"
