"""docs/journal.md: every test it cites exists, and its example parses."""

from __future__ import annotations

import re
from pathlib import Path

from tests.doc_citations import cited_tests

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "journal.md"


def test_every_cited_test_exists() -> None:
    cited = cited_tests(PAGE.read_text())
    for file, name in cited:
        source = (ROOT / file).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{file}::{name}"
    assert len(cited) >= 11
