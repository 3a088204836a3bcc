"""The tests a docs page cites as holding its claims: ``path::name`` in backticks, and bare
``test_...`` names after it, which belong to the file cited last (code blocks cite nothing)."""

from __future__ import annotations

import re


def cited_tests(text: str) -> list[tuple[str, str]]:
    """(test file, test name) for each citation in ``text``, in order."""
    cited, current = [], ""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for token in re.findall(r"`([^`\n]+)`", text):
        if "::" in token:
            current, name = token.split("::", 1)
            cited.append((current, name))
        elif re.fullmatch(r"test_\w+", token) and current:
            cited.append((current, token))
    return cited
