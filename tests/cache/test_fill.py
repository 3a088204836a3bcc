"""A filling epoch runs upstream's source and stages as stages of the cached pipeline's own run."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncflow import Pipeline, PipelineError, Split
from asyncflow.cache._format import HEADER_BYTES, leftovers
from asyncflow.pipeline import Processes


def loop_threads(name: str) -> list[str]:
    """The event-loop threads of runs of pipelines named ``name`` (``asyncflow-<name>``; their
    worker threads are ``asyncflow-<name>-worker-<n>``)."""
    return [t.name for t in threading.enumerate() if t.name == f"asyncflow-{name}"]


def batch(i: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((4, 8), i, np.uint8), np.arange(4 * i, 4 * i + 4)


def labels(items: Any) -> list[int]:
    return [int(x) for _, b in items for x in b]


def test_a_sync_upstream_is_advanced_on_the_runs_threads_not_its_loop(tmp_path: Path) -> None:
    advanced_in: set[str] = set()

    def upstream() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(3):
            advanced_in.add(threading.current_thread().name)  # it may list files or read
            yield batch(i)

    pipe = Pipeline(upstream, name="sync").cache(tmp_path / "c", batched=True)
    assert labels(pipe) == list(range(12))  # fills the cache
    assert advanced_in and all(name.startswith("asyncflow-sync-worker-") for name in advanced_in)


def test_a_filling_epoch_is_one_run_on_one_loop_thread(tmp_path: Path, leak_check: None) -> None:
    seen: list[list[str]] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        seen.append(loop_threads("nested?"))
        return batch(i)

    pipe = Pipeline(range(6), name="nested?").map(make).cache(tmp_path / "c", batched=True)
    with pipe.open() as run:
        assert labels(run) == list(range(24))
    assert len(seen) == 6
    assert all(len(names) == 1 for names in seen), seen  # one run: no second loop thread
    assert (tmp_path / "c").exists()
    assert labels(pipe) == list(range(24)) and len(seen) == 6  # replayed


def test_stats_of_a_filling_epoch_name_upstreams_stages_and_the_cache_stage(
    tmp_path: Path
) -> None:
    pipe = Pipeline(range(6)).map(batch, name="decode").cache(tmp_path / "c", batched=True)
    pipe = pipe.map(lambda b: b, name="after")
    list(pipe)
    stats = pipe.stats()
    assert [s.name for s in stats.stages] == ["source", "decode", "cache", "after"]
    assert stats["decode"].items_out == 6 and stats["cache"].items_in == 6
    assert stats["cache"].items_out == 6 and stats["after"].items_out == 6
    list(pipe)  # a replay: the cache is the source
    assert [s.name for s in pipe.stats().stages] == ["source", "after"]


def test_a_cache_found_truncated_is_rebuilt_in_the_same_epoch(tmp_path: Path) -> None:
    made: list[int] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        made.append(i)
        return batch(i)

    pipe = Pipeline(range(6)).map(make).cache(tmp_path / "c", batched=True)
    list(pipe)
    with open(tmp_path / "c" / "field0.npy", "r+b") as fh:
        fh.truncate(HEADER_BYTES + 8)
    assert labels(pipe) == list(range(24)) and len(made) == 12
    assert labels(pipe) == list(range(24)) and len(made) == 12


def test_a_cache_found_unusable_as_a_replay_begins_fails_that_epoch_and_the_next_rebuilds(
    tmp_path: Path, leak_check: None
) -> None:
    made: list[int] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        made.append(i)
        return batch(i)

    pipe = Pipeline(range(6)).map(make).cache(tmp_path / "c", batched=True)
    list(pipe)
    # its checksum table (size kept): found as the replay begins (a damaged .npy header is
    # found before the epoch, which then rebuilds at once: tests/cache/test_cached.py)
    with open(tmp_path / "c" / "field0.crc32", "r+b") as fh:
        fh.seek(1)
        fh.write(b"X")
    with pytest.raises(PipelineError, match=r"SourceError: .* the next epoch rebuilds it"):
        list(pipe)
    assert labels(pipe) == list(range(24)) and len(made) == 12
    assert leftovers(tmp_path / "c") == []


def test_an_iterator_upstream_is_not_read_twice(tmp_path: Path) -> None:
    pipe = Pipeline(iter(range(200))).map(batch).cache(tmp_path / "c", batched=True)
    for i, _ in enumerate(pipe):
        if i == 1:
            break
    del _
    with pytest.raises(Exception, match="can be read once"):
        list(pipe)
    assert not (tmp_path / "c").exists()


class Upstream:
    """An iterator class: the class itself is the upstream's factory (each call a fresh one)."""

    def __init__(self) -> None:
        self.left = iter(range(6))

    def __iter__(self) -> Upstream:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return batch(next(self.left))


def test_a_class_upstream_is_a_factory_read_again_by_a_later_filling_epoch(
    tmp_path: Path
) -> None:
    pipe = Pipeline(Upstream).cache(tmp_path / "c", batched=True)
    for i, _ in enumerate(pipe):
        if i == 1:
            break
    del _
    assert labels(pipe) == list(range(24)) and labels(pipe) == list(range(24))
    assert leftovers(tmp_path / "c") == []


def test_a_stage_of_upstream_failing_on_its_last_item_writes_nothing(
    tmp_path: Path, leak_check: None
) -> None:
    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        if i == 5:
            raise ValueError("bad item")
        return batch(i)

    pipe = Pipeline(range(6)).map(make).cache(tmp_path / "c", batched=True)
    with pytest.raises(PipelineError, match="bad item"):
        list(pipe)
    assert not (tmp_path / "c").exists() and leftovers(tmp_path / "c") == []


def test_items_skipped_under_upstreams_failure_budget_are_left_out_of_the_cache(
    tmp_path: Path
) -> None:
    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        if i == 2:
            raise ValueError("bad item")
        return batch(i)

    upstream = Pipeline(range(6), max_failures=1).map(make)
    pipe = upstream.cache(tmp_path / "c", batched=True)
    assert pipe.options.max_failures == 0  # upstream's budget goes with upstream's stages
    expected = [x for i in (0, 1, 3, 4, 5) for x in range(4 * i, 4 * i + 4)]
    assert labels(pipe) == expected
    assert labels(pipe) == expected  # replayed


def test_a_cached_mix_fills_in_one_run_then_replays_the_same_items(
    tmp_path: Path, leak_check: None
) -> None:
    import asyncflow

    seen: list[list[str]] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        seen.append(loop_threads("mixed"))
        return batch(i)

    inputs = [Pipeline(range(0, 5)).map(make), Pipeline(range(5, 9)).map(make)]
    pipe = asyncflow.mix(inputs, seed=3, stop="all").with_options(name="mixed")
    cached = pipe.cache(tmp_path / "c", batched=True)
    filled = labels(cached)
    assert sorted(filled) == list(range(36))
    assert len(seen) == 9 and all(len(names) == 1 for names in seen), seen
    assert "cache" in [s.name for s in cached.stats().stages]
    assert labels(cached) == filled and len(seen) == 9  # replayed, upstream not read


def test_a_cache_of_a_shuffled_cache_writes_the_batches_its_upstream_defers(
    tmp_path: Path
) -> None:
    inner = Pipeline(range(6)).map(batch).cache(tmp_path / "a", batched=True)
    list(inner)  # filled: the next epochs replay it
    upstream = inner.shuffle(seed=3)  # its batches come deferred, copied by a receive hook
    outer = upstream.cache(tmp_path / "b", batched=True)
    first = labels(outer)  # fills b, the hook applied upstream of the cache stage
    assert sorted(first) == list(range(24)) and first != list(range(24))
    assert labels(outer) == first  # replayed from b: what the hook made was written


def draw(item: str) -> float:
    """In a worker process: the first draw of the reseeded ``random`` (its item's stream)."""
    return random.random()


def test_a_fill_seeds_upstreams_items_as_upstream_alone_does(tmp_path: Path) -> None:
    # upstream's source is read by the run's source node, so a Split share keys each item by
    # its list index (seeding.KeyedIterator) in the filling run too, not by its position
    share = Split(rank=1, world_size=2)([f"s{i}" for i in range(9)])
    upstream = Pipeline(share).map(draw, workers=Processes(seed=7))
    alone = list(upstream)
    cached = upstream.cache(tmp_path / "c")
    assert list(cached) == alone  # filled, in epoch 0 as upstream's first run
    assert list(cached) == alone  # replayed
