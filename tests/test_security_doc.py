"""SECURITY.md names the test that holds each promise: every test it names exists (so the page cannot
drift from the battery), and every attack test file is cited somewhere on it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # the document and the tests it cites are the same whoever runs them

ROOT = Path(__file__).resolve().parent.parent
REF = re.compile(r"`(?:(test_[a-z0-9_]+\.py))?::(test_[a-z0-9_]+)`")


def _cited() -> list[tuple[str, str]]:
    """(file, test) for each citation; ``::name`` alone means the file cited last in its cell."""
    cited = []
    for line in (ROOT / "SECURITY.md").read_text().splitlines():
        current = None
        for m in REF.finditer(line):
            current = m.group(1) or current
            assert current is not None, f"{m.group(0)} names no file: {line}"
            cited.append((current, m.group(2)))
    return cited


def _tests(file: str) -> set[str]:
    tree = ast.parse((ROOT / "tests" / file).read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


@pytest.mark.slow
def test_every_cited_test_exists():
    cited = _cited()
    assert len(cited) > 40
    missing = [f"{f}::{t}" for f, t in cited if t not in _tests(f)]
    assert missing == []


def test_every_attack_battery_file_is_cited():
    files = {f for f, _ in _cited()}
    battery = {p.name for p in (ROOT / "tests").glob("test_attacks*.py")}
    assert battery - files == set()
