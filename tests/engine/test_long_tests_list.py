"""tests/long_tests.txt names tests that exist: an entry left behind by a rename marks nothing, and the
renamed test, if still long, runs in `make test` unmarked."""
from __future__ import annotations

import re

from tests.conftest import LONG_TESTS

ROOT = LONG_TESTS.parent.parent


def test_every_long_test_entry_names_a_test_function_of_its_file():
    missing = []
    for line in LONG_TESTS.read_text().splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        path, _, name = entry.partition("::")
        name = name.split("[", 1)[0]
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^def {re.escape(name)}\(", source.read_text(), re.MULTILINE):
            missing.append(entry)
    assert missing == []
