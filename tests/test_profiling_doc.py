"""docs/profiling.md: its stats table is today's layout, each column is explained, and every
test it cites as holding a claim exists."""

from __future__ import annotations

import re
from pathlib import Path

from asyncflow.report._tables import _STATS_HEADERS
from tests.doc_citations import cited_tests

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "profiling.md"


def _demo_table() -> list[str]:
    text = PAGE.read_text()
    block = re.search(r"```text\n(stage .*?)```", text, flags=re.S)
    assert block is not None, "the demo's stats table is missing"
    return block.group(1).splitlines()


def test_the_table_has_today_s_columns() -> None:
    header = _demo_table()[0]
    assert re.split(r"\s{2,}", header.strip()) == list(_STATS_HEADERS)


def test_every_column_is_explained() -> None:
    text = PAGE.read_text()
    for column in _STATS_HEADERS:
        assert f"- **`{column}`**" in text, column


def test_the_table_counts_images_and_hides_internal_stages() -> None:
    rows = {line.split()[0]: [c for c in line.split() if c != "*"]
            for line in _demo_table()[2:] if line and line[0] not in " -"}
    assert {"source", "decode", "batch"} <= set(rows)
    assert "rows" not in rows and "claim" not in rows
    assert rows["decode"][3:5] == ["256", "256"]
    assert rows["batch"][1] == "assemble" and rows["batch"][3:5] == ["256", "8"]
    assert any(line.startswith("internal stages hidden: ") for line in _demo_table())


def test_every_cited_test_exists() -> None:
    cited = cited_tests(PAGE.read_text())
    for file, name in cited:
        source = (ROOT / file).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{file}::{name}"
    assert len(cited) >= 15
