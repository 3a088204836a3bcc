"""``Pipeline[T]`` for type checkers: mypy follows the item type through a pipeline.

One snippet, checked by mypy (``--strict``) in this process: each ``assert_type`` must hold,
each line marked ``# error: CODE`` must be reported with that code and no other line may be,
and each ``# reveal: TYPE`` must be what ``reveal_type`` shows (less module paths). Only the
modules the snippet is about are analysed (the rest of the package, torch and numpy are
``Any``), so it takes a couple of seconds; ``mypy`` over the whole package checks the rest.
"""

from __future__ import annotations

import re
from pathlib import Path

import mypy.api
import pytest

import asyncflow
from asyncflow import Pipeline, Run

ROOT = Path(asyncflow.__file__).resolve().parents[1]

SNIPPET = '''
from collections.abc import AsyncIterator, Iterator
from typing import Any, assert_type

from asyncflow import Pipeline, Run, mix
from asyncflow.cache import CachedPipeline
from asyncflow.cache._cached import cache


def numbers() -> Iterator[int]:
    yield 1


async def words() -> AsyncIterator[str]:
    yield "a"


async def halve(x: int) -> float:
    return x / 2


def explode(s: str) -> list[bytes]:
    return [s.encode()]


async def aexplode(s: str) -> AsyncIterator[bytes]:
    yield s.encode()


ints = Pipeline(range(3))
assert_type(ints, Pipeline[int])
assert_type(Pipeline(numbers), Pipeline[int])
assert_type(Pipeline(numbers()), Pipeline[int])
assert_type(Pipeline(words), Pipeline[str])
assert_type(Pipeline(words()), Pipeline[str])
assert_type(Pipeline([1.5], name="floats"), Pipeline[float])
assert_type(ints.map(str), Pipeline[str])
assert_type(ints.map(halve, concurrency=4), Pipeline[float])
assert_type(ints.map(lambda x: [x]), Pipeline[list[int]])
assert_type(ints.filter(lambda x: x > 1), Pipeline[int])
assert_type(ints.map(str).flat_map(explode), Pipeline[bytes])
assert_type(ints.map(str).flat_map(aexplode), Pipeline[bytes])
assert_type(ints.batch(4), Pipeline[list[int]])
assert_type(ints.batch(4).unbatch(), Pipeline[int])
assert_type(ints.prefetch(2).shuffle(seed=0).progress(), Pipeline[int])
assert_type(ints.with_source(range(9)).with_options(name="x").without_hooks(), Pipeline[int])
assert_type(ints.to_device("cpu"), Pipeline[int])
assert_type(ints.cache("/tmp/cache"), Pipeline[int])
assert_type(cache(ints, "/tmp/cache"), CachedPipeline[int])
assert_type(cache(ints, "/tmp/cache").shuffle(seed=1), CachedPipeline[int])
assert_type(mix([ints, ints.map(lambda x: x + 1)]), Pipeline[int])
assert_type(ints.open(), Run[int])
assert_type(next(ints.open()), int)
for i in ints:
    assert_type(i, int)
with ints.open(timeout=1.0) as run:
    assert_type(run, Run[int])
    assert_type(next(run), int)


async def consume() -> None:
    async for word in ints.map(str):
        assert_type(word, str)
    async with ints.batch(2).open() as arun:
        assert_type(await arun.__anext__(), list[int])


objects: Pipeline[object] = ints  # a pipeline only yields: Pipeline[int] is a Pipeline[object]
bare: Pipeline = Pipeline(range(3))  # a bare annotation means Pipeline[Any]
assert_type(bare, Pipeline[Any])
assert_type(bare.unbatch(), Pipeline[Any])
reveal_type(ints.batch(2))  # reveal: Pipeline[list[int]]
reveal_type(ints.open())  # reveal: Run[int]
reveal_type(Pipeline(words).map(len))  # reveal: Pipeline[int]

ints.map(str.upper)  # error: arg-type
ints.filter(str.isdigit)  # error: arg-type
ints.flat_map(halve)  # error: arg-type
ints.unbatch()  # error: misc
strings: Pipeline[str] = ints  # error: assignment
Pipeline(42)  # error: arg-type
'''

CONFIG = """\
[mypy]
strict = True
show_error_codes = True
mypy_path = {root}
ignore_missing_imports = True
follow_imports = skip

[mypy-{analysed}]
follow_imports = silent
"""
ANALYSED = (
    "asyncflow", "asyncflow.pipeline", "asyncflow.pipeline.*", "asyncflow.cache",
    "asyncflow.cache._cached", "asyncflow.sources._mix",
)

_LINE = re.compile(r"^snippet\.py:(\d+): (error|note): (.*?)(?:  \[([a-z-]+)\])?$")


@pytest.mark.timeout(120)
def test_mypy_follows_the_item_type(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG.format(root=ROOT, analysed=",".join(ANALYSED)))
    stdout, stderr, _ = mypy.api.run([
        "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), str(snippet),
    ])
    assert not stderr, stderr

    lines = SNIPPET.splitlines()
    expected_errors = {
        n: m.group(1) for n, text in enumerate(lines, start=1)
        if (m := re.search(r"# error: ([a-z-]+)$", text))
    }
    expected_reveals = {
        n: m.group(1) for n, text in enumerate(lines, start=1)
        if (m := re.search(r"# reveal: (\S+)$", text))
    }
    errors: dict[int, str] = {}
    reveals: dict[int, str] = {}
    for out in stdout.replace(str(tmp_path) + "/", "").splitlines():
        m = _LINE.match(out)
        if m is None:
            continue
        line, kind, message, code = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if kind == "error":
            errors.setdefault(line, code or "")
        elif message.startswith("Revealed type is"):
            # Without module paths: "asyncflow.pipeline._run.Run[int]" is "Run[int]".
            revealed = message.removeprefix("Revealed type is ").strip('"')
            reveals[line] = re.sub(r"\b[\w.]+\.(\w+)", r"\1", revealed)
    assert errors == expected_errors, stdout
    assert reveals == expected_reveals, stdout


def test_pipeline_and_run_are_subscriptable_at_run_time() -> None:
    assert Pipeline[int].__origin__ is Pipeline  # type: ignore[attr-defined]
    assert Run[str].__origin__ is Run  # type: ignore[attr-defined]
    assert list(Pipeline[int](range(3)).map(str)) == ["0", "1", "2"]
