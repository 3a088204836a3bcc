"""docs/concepts.md: the tests its picture cites exist, and the threads it names are real."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from asyncflow import Pipeline
from tests.doc_citations import cited_tests

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "concepts.md"


def test_every_cited_test_exists() -> None:
    cited = cited_tests(PAGE.read_text())
    for file, name in cited:
        source = (ROOT / file).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{file}::{name}"
    assert len(cited) >= 15  # the picture's claims cite their tests


def test_the_threads_are_those_the_picture_names() -> None:
    page = PAGE.read_text()
    assert '"asyncflow-<name>"' in page and '"asyncflow-<name>-worker-<n>"' in page
    seen: dict[str, set[str]] = {"async": set(), "sync": set()}

    async def on_loop(x: int) -> int:
        seen["async"].add(threading.current_thread().name)
        return x

    def on_thread(x: int) -> int:
        seen["sync"].add(threading.current_thread().name)
        time.sleep(0.01)  # not cheap: stays on the worker threads
        return x

    pipe = Pipeline(range(8), name="pic").map(on_loop).map(on_thread, concurrency=2)
    assert list(pipe) == list(range(8))
    assert seen["async"] == {"asyncflow-pic"}
    assert seen["sync"] and all(re.fullmatch(r"asyncflow-pic-worker-\d+", n)
                                for n in seen["sync"])


def test_the_layer_picture_names_every_top_level_module_and_package() -> None:
    picture = PAGE.read_text().split("### Layers", 1)[1].split("```", 2)[1]
    package = ROOT / "asyncflow"
    names = [p.name for p in package.glob("*.py")]
    names += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    assert len(names) > 10
    missing = [name for name in names if name not in picture]
    assert not missing, f"docs/concepts.md's layer picture leaves out {missing}"
