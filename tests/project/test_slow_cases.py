"""tests/slow_cases.txt names tests that exist: a renamed or moved test would otherwise drop out of
the slow job's list silently and come back into the default job."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_slow_case_names_a_test():
    lines = [ln.strip() for ln in (TESTS / "slow_cases.txt").read_text().splitlines()]
    ids = [ln for ln in lines if ln and not ln.startswith("#")]
    assert ids and len(ids) == len(set(ids))
    for node in ids:
        path, _, rest = node.partition("::")
        name = rest.split("::")[-1].split("[")[0]  # a method of a test class, or a function
        source = TESTS.parent / path
        assert source.is_file(), f"{node}: no file {path}"
        assert re.search(rf"^\s*def {re.escape(name)}\(", source.read_text(), re.M), f"{node}: no test {name}"
