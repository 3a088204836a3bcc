"""docs/remote.md: the remote recipe reads without head-of-line blocking (issue 26), and every
documented read stage does too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
         *sorted((ROOT / "examples").glob("*.py"))]
# A stage that reads objects: read_bytes itself, or a function named read that calls it.
_READ_STAGE = re.compile(r"\.map\(\s*(?:asyncflow\.)?(read_bytes|read)\b[^\n]*")


def test_every_documented_read_stage_is_unordered() -> None:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _READ_STAGE.finditer(text):
            call = text[match.start():text.find(")", match.end() - 1) + 1]
            if "concurrency" in call or "concurrency" in match.group(0):
                found.append((page.name, match.group(0)))
    assert found, "no documented read stage found: the pattern is stale"
    ordered = [(page, line) for page, line in found if "ordered=False" not in line]
    # An ordered read stage makes every object wait for the slowest one in flight.
    assert ordered == []


def test_the_remote_page_says_why_the_recipe_is_unordered() -> None:
    text = (ROOT / "docs" / "remote.md").read_text()
    assert ".map(asyncflow.read_bytes, concurrency=256, ordered=False)" in text
    assert "**Why `ordered=False`.**" in text
    assert "slowest one ahead of it" in text
