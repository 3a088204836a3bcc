"""docs/migrating.md: every test the page cites as holding a claim exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.doc_citations import cited_tests

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["docs/migrating.md", "docs/frameworks.md"]


def test_every_cited_test_exists() -> None:
    checked = 0
    for page in PAGES:
        path = ROOT / page
        if not path.exists():
            continue
        for file, name in cited_tests(path.read_text()):
            source = (ROOT / file).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{page}: {file}::{name}"
            checked += 1
    assert checked >= 30  # the migration table cites its tests
