"""Per-item seeds follow the item through ``Split`` (issue 16): a share's iterator keys each
item by its index in the whole list (``seeding.KeyedIterator``), and process workers seed
from that key, so an item draws the same stream on any rank, under any world size, before
and after an elastic resume, and no two items of an epoch share a stream.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from asyncflow import Pipeline, Split
from asyncflow.pipeline import Processes
from asyncflow.pipeline.seeding import KeyedIterator, item_seed

SEED = 7
ITEMS = [f"s{i}" for i in range(23)]


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def draw(item: str) -> tuple[str, float]:
    """In a worker process: the item and its first draw from the reseeded ``random``."""
    return item, random.random()


def expected(epoch: int, key: int) -> float:
    """The first draw of the stream ``item_seed(SEED, epoch, key)`` seeds."""
    return random.Random(item_seed(SEED, epoch, key)).random()


def _keyed(iterable: Any) -> list[tuple[Any, int]]:
    it: Iterator[Any] = iter(iterable)
    assert isinstance(it, KeyedIterator)
    items = list(it)
    return [(item, it.seed_key(i)) for i, item in enumerate(items)]


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_an_item_is_keyed_by_its_list_index_on_any_rank(remainder: str, shuffle: bool) -> None:
    for n in (0, 1, 5, 23):
        items = list(range(100, 100 + n))
        for world in (1, 2, 3, 4):
            keys: list[int] = []
            for rank in range(world):
                split = Split(rank=rank, world_size=world, remainder=remainder,  # type: ignore[arg-type]
                              shuffle=shuffle, seed=3)
                pairs = _keyed(split(items, epoch=2))
                assert all(items[key] == item for item, key in pairs)
                keys += [key for _, key in pairs]
            # every item its own key; "pad" repeats an item with its key, "drop" leaves some out
            unique = sorted(set(keys))
            assert unique == list(range(n)) or (remainder == "drop" and len(unique) > n - world)


def test_a_resumed_share_keys_the_items_left_by_their_list_index() -> None:
    from asyncflow.pipeline import state_checksum as _checksum
    from asyncflow.pipeline._span import Span

    rng = random.Random(0)
    for shuffle in (False, True):
        shares = [Split(rank=r, world_size=3, shuffle=shuffle)(ITEMS, epoch=1) for r in range(3)]
        states, done = [], set()
        for share in shares:
            pairs = _keyed(share)
            settled = [j for j in range(len(pairs)) if rng.random() < 0.4]
            done |= {pairs[j][0] for j in settled}
            body = {"positions": Span.of(0, settled).to_json(), "split": share.split_state()}
            states.append(json.loads(json.dumps({**body, "check": _checksum(body)})))
        left = []
        for rank in range(2):
            split = Split(rank=rank, world_size=2, shuffle=shuffle)
            pairs = _keyed(split.resume(ITEMS, states))
            assert all(ITEMS[key] == item for item, key in pairs)
            left += [item for item, _ in pairs]
        assert set(left) == set(ITEMS) - done


async def _listing() -> AsyncIterator[str]:
    for item in ITEMS:
        yield item


async def test_an_async_listing_share_is_keyed_alike() -> None:
    for rank in range(3):
        it = Split(rank=rank, world_size=3)(_listing()).__aiter__()
        assert isinstance(it, KeyedIterator)
        items = [item async for item in it]
        assert [ITEMS[it.seed_key(i)] for i in range(len(items))] == items


def _run(pipe: Pipeline[Any], stop: int | None = None) -> tuple[list[tuple[str, float]], Any]:
    it = iter(pipe)
    got = list(it) if stop is None else [next(it) for _ in range(stop)]
    state = json.loads(json.dumps(pipe.state_dict()))
    del it
    return got, state


def _process_map(source: Any) -> Pipeline[Any]:
    return Pipeline(source).map(draw, workers=Processes(seed=SEED))


def test_process_workers_draw_the_same_for_an_item_on_any_world_size_and_after_a_resume(
    leak_check: None,
) -> None:
    for world in (1, 2, 3):
        got = []
        for rank in range(world):
            got += _run(_process_map(Split(rank=rank, world_size=world)(ITEMS)))[0]
        assert all(value == expected(0, ITEMS.index(item)) for item, value in got), world
        assert len({value for _, value in got}) == len(ITEMS)  # no two items share a stream
    # saved part-way on 3 ranks, resumed on 2: the items left draw what they always would
    delivered, states = [], []
    for rank, stop in enumerate([2, 5, 0]):
        got, state = _run(_process_map(Split(rank=rank, world_size=3)(ITEMS)), stop)
        delivered += got
        states.append(state)
    for rank in range(2):
        delivered += _run(_process_map(Split(rank=rank, world_size=2).resume(ITEMS, states)))[0]
    assert sorted(item for item, _ in delivered) == sorted(ITEMS)
    assert all(value == expected(0, ITEMS.index(item)) for item, value in delivered)


def test_a_resumed_pipeline_built_on_the_states_epoch_draws_that_epochs_streams() -> None:
    delivered, states = [], []
    for rank, stop in enumerate([3, 1, 3]):  # 16 left: no padding on 2 ranks
        pipe = _process_map(Split(rank=rank, world_size=3)(ITEMS))
        list(pipe)  # epoch 0, whole
        got, state = _run(pipe, stop)  # epoch 1, in part
        delivered += got
        states.append(state)
    assert {state["epoch"] for state in states} == {1}  # the pipelines' epoch
    for rank in range(2):
        share = Split(rank=rank, world_size=2).resume(ITEMS, states)
        pipe = _process_map(share).with_source(share, epoch=states[0]["epoch"])
        delivered += _run(pipe)[0]
    assert sorted(item for item, _ in delivered) == sorted(ITEMS)
    assert all(value == expected(1, ITEMS.index(item)) for item, value in delivered)


def test_a_pipeline_not_over_a_split_is_seeded_by_position_as_before() -> None:
    got = _run(_process_map(ITEMS[::-1]))[0]  # keyed by position, not by anything in the item
    assert [value for _, value in got] == [expected(0, k) for k in range(len(ITEMS))]
    ranks = [_run(_process_map(iter(ITEMS[r::2])))[0] for r in range(2)]
    # a plain iterator carries no keys: both halves draw positions 0, 1, ... alike
    assert [v for _, v in ranks[0][:11]] == [v for _, v in ranks[1][:11]]


def _twice(item: str) -> list[str]:
    return [item + "a", item + "b"]


def _keep(item: str) -> bool:
    return True


@pytest.mark.parametrize("stage", ["flat_map", "filter"])
def test_after_a_flat_map_the_ranks_draw_by_position(stage: str) -> None:
    # a flat_map's or a filter's outputs are not numbered as the source's items: a stage
    # after it numbers its own inputs
    draws = []
    for rank in range(2):
        pipe = Pipeline(Split(rank=rank, world_size=2)(ITEMS))
        pipe = pipe.flat_map(_twice) if stage == "flat_map" else pipe.filter(_keep)
        got = _run(pipe.map(draw, workers=Processes(seed=SEED)))[0]
        draws.append([value for _, value in got])
    assert draws[0] == draws[1] == [expected(0, k) for k in range(len(draws[0]))]


def test_a_share_resumed_by_load_state_dict_draws_the_same() -> None:
    share = Split(rank=1, world_size=3)(ITEMS)
    first, state = _run(_process_map(share), 3)
    pipe = _process_map(share)
    pipe.load_state_dict(state)
    rest = _run(pipe)[0]
    assert [item for item, _ in first + rest] == list(share)
    assert all(value == expected(0, ITEMS.index(item)) for item, value in first + rest)
