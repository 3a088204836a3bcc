"""docs/performance.md lists every benchmark in benchmarks/ (issue 25.13: 5 listed, 11 there)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_benchmark_is_listed() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \| `(bench_\w+\.py)` \|", page, re.MULTILINE))
    scripts = {(p.stem.removeprefix("bench_"), p.name)
               for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert not scripts - listed, f"add a row to docs/performance.md's table for {scripts - listed}"
    assert not listed - scripts, f"docs/performance.md lists missing benchmarks {listed - scripts}"
