"""docs/remote.md: the remote recipe reads without head-of-line blocking (issue 26), and every
documented read stage does too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
         *sorted((ROOT / "examples").glob("*.py"))]
# A stage that reads objects: read_bytes itself, or a function named read that calls it.
_READ_STAGE = re.compile(r"\.map\(\s*(?:asyncflow\.)?(read_bytes|read)\b")


def _call(text: str, start: int) -> str:
    """The ``.map(...)`` call that opens at ``start``, to its closing parenthesis."""
    depth = 0
    for end in range(text.index("(", start), len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end + 1]
    return text[start:]


def test_every_documented_read_stage_is_unordered() -> None:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _READ_STAGE.finditer(text):
            call = " ".join(_call(text, match.start()).split())
            if "concurrency" in call:
                found.append((page.name, call))
    assert found, "no documented read stage found: the pattern is stale"
    ordered = [(page, call) for page, call in found if "ordered=False" not in call]
    # An ordered read stage makes every object wait for the slowest one in flight.
    assert ordered == []


def test_the_remote_page_says_why_the_recipe_is_unordered() -> None:
    text = (ROOT / "docs" / "remote.md").read_text()
    assert ".map(asyncflow.read_bytes, concurrency=256, ordered=False)" in text
    assert "**Why `ordered=False`.**" in text
    assert "slowest one ahead of it" in text
