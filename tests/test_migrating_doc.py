"""docs/migrating.md: every test the page cites as holding a claim exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["docs/migrating.md", "docs/frameworks.md"]


def _cited(text: str) -> list[tuple[str, str]]:
    """(test file, test name) for each citation: ``path::name``, and bare ``test_...`` names
    after it, which belong to the file cited last."""
    cited, current = [], ""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks cite nothing
    for token in re.findall(r"`([^`\n]+)`", text):
        if "::" in token:
            current, name = token.split("::", 1)
            cited.append((current, name))
        elif re.fullmatch(r"test_\w+", token) and current:
            cited.append((current, token))
    return cited


def test_every_cited_test_exists() -> None:
    checked = 0
    for page in PAGES:
        path = ROOT / page
        if not path.exists():
            continue
        for file, name in _cited(path.read_text()):
            source = (ROOT / file).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{page}: {file}::{name}"
            checked += 1
    assert checked >= 30  # the migration table cites its tests
