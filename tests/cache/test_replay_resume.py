"""A cache replay resumes exactly: in stored order, or shuffled with a seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncflow import ConfigError

from .test_cached import images, labels


def _interrupted(make: Any, k: int) -> tuple[list[list[int]], list[list[int]]]:
    first = make()
    with first.open() as run:
        head = [next(run)[1].tolist() for _ in range(k)]
        state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    return head, labels(resumed)


@pytest.mark.parametrize("seed", [None, 3])
def test_a_replaying_epoch_resumes_exactly(tmp_path: Path, seed: int | None) -> None:
    list(images(count=40, batch=8).cache(tmp_path / "c"))  # fills the cache

    def make() -> Any:
        pipe = images(count=40, batch=8).cache(tmp_path / "c")
        return pipe if seed is None else pipe.shuffle(seed=seed)

    full = labels(make())
    assert sorted(x for batch in full for x in batch) == list(range(40))
    for k in (0, 1, 3, 5):
        head, rest = _interrupted(make, k)
        assert head + rest == full, k


def test_a_filling_epoch_is_refused_naming_the_cache_stage(tmp_path: Path) -> None:
    pipe = images(count=40, batch=8).cache(tmp_path / "c")
    with pipe.open() as run:
        next(run)
        with pytest.raises(ConfigError, match="stage 'cache'"):
            pipe.state_dict()


def test_a_shuffled_replay_resumes_a_later_epochs_order(tmp_path: Path) -> None:
    """A state taken in epoch 2 resumes epoch 2's order, not epoch 0's; the run after it
    is epoch 3's order."""
    list(images(count=40, batch=8).cache(tmp_path / "c"))  # fills the cache

    def make() -> Any:
        return images(count=40, batch=8).cache(tmp_path / "c").shuffle(seed=5)

    reference = make()
    orders = [labels(reference) for _ in range(4)]
    assert orders[2] != orders[0] and orders[3] != orders[2]
    for k in (0, 2):
        first = make()
        labels(first)
        labels(first)  # epochs 0 and 1
        with first.open() as run:  # epoch 2
            head = [next(run)[1].tolist() for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))
        assert state["epoch"] == 2
        resumed = make()
        resumed.load_state_dict(state)
        assert head + labels(resumed) == orders[2], k
        assert labels(resumed) == orders[3]


def test_a_state_of_another_caches_replay_is_refused(tmp_path: Path) -> None:
    """Issue 25, point 3: a replay's state names the data its cache holds; the same data
    in a cache at another path resumes, other data is refused."""
    for name, key in (("a", 1), ("moved", 1), ("b", 2)):
        list(images(count=40, batch=8).cache(tmp_path / name, key=key))
    first = images(count=40, batch=8).cache(tmp_path / "a", key=1)
    with first.open() as run:
        next(run)
        state = json.loads(json.dumps(first.state_dict()))
    moved = images(count=40, batch=8).cache(tmp_path / "moved", key=1)
    moved.load_state_dict(state)
    assert len(labels(moved)) == 4
    with pytest.raises(ConfigError, match="its listing changed"):
        images(count=40, batch=8).cache(tmp_path / "b", key=2).load_state_dict(state)


def _broken_hook(run: Any) -> Any:
    raise RuntimeError("the hook failed as its run started")


def test_the_replay_order_follows_the_runs_epoch_after_a_run_that_never_read_it(
    tmp_path: Path, leak_check: None
) -> None:
    """Issue 24 (one owner of the epoch): a run stopped before its source was opened (a
    consumer hook failed as it started) took its epoch all the same; the next run is epoch
    1, and the cache, keeping no count of its own to fall behind, replays epoch 1's order:
    the epoch its state would save."""
    list(images(count=40, batch=8).cache(tmp_path / "c"))  # fills the cache

    def make() -> Any:
        return images(count=40, batch=8).cache(tmp_path / "c").shuffle(seed=5)

    reference = make()
    orders = [labels(reference) for _ in range(2)]
    assert orders[0] != orders[1]
    pipe = make()
    broken = pipe.with_hook(_broken_hook)  # shares the pipeline's source and epoch count
    with pytest.raises(RuntimeError, match="hook failed"), broken.open() as run:
        next(run)
    with pipe.open() as run:
        assert [batch[1].tolist() for batch in run] == orders[1]
        assert run.epoch == 1
