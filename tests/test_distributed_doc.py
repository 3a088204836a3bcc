"""docs/distributed.md: every test it cites exists, and its example table is the rule's."""

from __future__ import annotations

import re
from pathlib import Path

from asyncflow import Split
from tests.doc_citations import cited_tests

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "distributed.md"


def test_every_cited_test_exists() -> None:
    cited = cited_tests(PAGE.read_text())
    for file, name in cited:
        source = (ROOT / file).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{file}::{name}"
    assert len(cited) >= 18


def test_the_ten_shard_table_is_what_split_gives() -> None:
    rows = re.findall(r"^\| (\d) \| ([\d, *]+) \| ([\d, ]+) \|$", PAGE.read_text(), re.M)
    assert len(rows) == 4
    for rank, pad, drop in rows:
        def cut(remainder: str, rank: str = rank) -> str:
            taken = Split(rank=int(rank), world_size=4, remainder=remainder).take(range(10))
            return ", ".join(map(str, taken))

        assert pad.replace("*", "").strip() == cut("pad")
        assert drop.strip() == cut("drop")
