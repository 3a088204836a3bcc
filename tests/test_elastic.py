"""Elastic resume: states saved on W ranks resume on W' ranks (asyncflow/_elastic.py,
``Split.resume``, ``Share.split_state``).

Most tests build the states as a pipeline does (``Share.split_state()`` plus the settled local
positions, passed through JSON) for many (W, W', length, interrupt) combinations; a few go
through real pipelines.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, Split
from asyncflow.pipeline import state_checksum as _checksum
from asyncflow.pipeline._span import Span
from asyncflow.ranks import Share
from asyncflow.ranks._elastic import remaining, settled_of, untouched_state


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _state(share: Share[int], settled: list[int]) -> dict[str, Any]:
    """What ``pipe.state_dict()`` holds for a pipeline over ``share`` that settled the local
    positions ``settled``: only the parts elastic resume reads, with a valid checksum."""
    body = {"positions": Span.of(0, list(settled)).to_json(), "split": share.split_state()}
    saved: dict[str, Any] = json.loads(json.dumps({**body, "check": _checksum(body)}))
    return saved


def _is_padding(share: Share[int], j: int) -> bool:
    """Whether local position ``j`` of ``share`` is a ``"pad"`` repeat: past the items that
    the cut holds (computed here from the sizes, independently of the library)."""
    state = share.split_state()
    n, count, index = int(state["n"]), int(state["count"]), int(state["index"])
    return index + j * count >= n - len(settled_of(n, state["history"]) or ())


def _phase(
    shares: list[Share[int]], rng: random.Random, *, finish: bool
) -> tuple[list[int], list[dict[str, Any]], int]:
    """Deliver part of each share (all of it with ``finish``), settling any subset of its
    positions (out of order, as an unordered map settles); returns the non-padding items
    delivered, each rank's state and how many padding repeats were delivered."""
    delivered, states, pads = [], [], 0
    for share in shares:
        items = list(share)
        assert len(items) == len(share)
        if finish:
            settled = list(range(len(items)))
        else:
            settled = [j for j in range(len(items)) if rng.random() < rng.random()]
        for j in settled:
            if _is_padding(share, j):
                pads += 1
            else:
                delivered.append(items[j])
        states.append(_state(share, settled))
    return delivered, states, pads


def _shares(world: int, items: list[int], states: list[Any] | None, **options: Any) -> list[Any]:
    if states is None:
        return [Split(rank=r, world_size=world, **options)(items) for r in range(world)]
    return [Split(rank=r, world_size=world, **options).resume(items, states)
            for r in range(world)]


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_item_left_is_delivered_once_across_world_sizes(
    remainder: str, shuffle: bool
) -> None:
    rng = random.Random(f"{remainder}{shuffle}")
    for trial in range(300):
        n = rng.choice([0, 1, 2, 5, rng.randrange(0, 120)])
        worlds = [rng.randrange(1, 9) for _ in range(3)]
        items = list(range(n))
        options = {"remainder": remainder, "shuffle": shuffle, "seed": trial}
        shares = _shares(worlds[0], items, None, **options)
        delivered, pads = [], 0
        for phase, world in enumerate(worlds):
            sizes = {len(share) for share in shares}
            assert len(sizes) == 1, f"unequal counts on {world} ranks: {sizes}"
            got, states, padded = _phase(shares, rng, finish=phase == len(worlds) - 1)
            delivered += got
            pads += padded
            if phase < len(worlds) - 1:
                shares = _shares(worlds[phase + 1], items, states, **options)
        counts = Counter(delivered)
        assert all(c == 1 for c in counts.values()), f"twice: {worlds} n={n}"
        if remainder == "pad":
            assert set(counts) == set(items), f"lost: {set(items) - set(counts)} {worlds}"
        else:
            assert pads == 0
            assert len(items) - len(counts) < sum(worlds)  # each cut drops < its world size


def test_remaining_lists_what_no_rank_settled() -> None:
    items = list(range(10))
    shares = _shares(3, items, None)  # parts: [0 3 6 9] [1 4 7 0*] [2 5 8 1*]
    states = [_state(shares[0], [0, 2]), _state(shares[1], [0, 3]), _state(shares[2], [])]
    left = remaining(states)
    assert left.left() == [2, 3, 4, 5, 7, 8, 9]  # 0, 6, 1 delivered; the pad 0 settles none
    resumed = [list(s) for s in _shares(2, items, states)]
    assert resumed == [[2, 4, 7, 9], [3, 5, 8, 2]]  # the first item left pads


def test_drop_counts_the_tail_it_left_out_as_settled() -> None:
    items = list(range(11))
    shares = _shares(3, items, None, remainder="drop")  # 9 and 10 dropped
    states = [_state(share, [0]) for share in shares]  # 0 1 2 delivered
    assert remaining(states).left() == [3, 4, 5, 6, 7, 8]
    resumed = _shares(4, items, states, remainder="drop")  # 6 left: 4 taken, 7 and 8 dropped
    assert [list(s) for s in resumed] == [[3], [4], [5], [6]]


def test_a_negative_seed_resumes() -> None:
    # Split takes any int seed (epoch_rng draws from it), but the states' seed was checked
    # as >= 0: a job run with seed=-3 saved states that no resume would read.
    items = list(range(10))
    options = {"shuffle": True, "seed": -3}
    shares = _shares(2, items, None, **options)
    order = [list(share) for share in shares]
    states = [_state(share, [0, 1]) for share in shares]
    done = {order[r][j] for r in range(2) for j in (0, 1)}
    resumed = [x for share in _shares(3, items, states, **options) for x in share]
    assert sorted(set(resumed)) == sorted(set(items) - done)


def test_a_resumed_share_is_plain_from_the_next_epoch() -> None:
    items = list(range(6))
    shares = _shares(2, items, None, shuffle=True, seed=3)
    states = [_state(share, [0, 1]) for share in shares]
    again = Split(rank=0, world_size=1, shuffle=True, seed=3).resume(items, states)
    assert len(again) == 2
    again.set_epoch(1)
    assert sorted(again) == items and again.split_state()["history"] == []


def test_the_original_position_stays_with_the_item() -> None:
    """A per-item key taken from the list (enumerate) survives a re-split, the pipeline's
    local position does not: docs/distributed.md says to key augmentations by the former."""
    items = [f"shard-{i}" for i in range(7)]
    keyed = list(enumerate(items))
    shares = _shares(2, keyed, None)  # type: ignore[arg-type]
    states = [_state(share, [0]) for share in shares]
    resumed = _shares(3, keyed, states)  # type: ignore[arg-type]
    assert all(items[key] == item for share in resumed for key, item in share)


def test_through_real_pipelines_and_json() -> None:
    items = list(range(23))
    got: list[int] = []
    states = []
    for rank, stop in enumerate([2, 5, 0]):
        pipe = Pipeline(Split(rank=rank, world_size=3)(items)).map(lambda x: x)
        it = iter(pipe)
        got += [next(it) for _ in range(stop)]
        states.append(json.loads(json.dumps(pipe.state_dict())))
        del it
    for rank in range(2):
        got += list(Pipeline(Split(rank=rank, world_size=2).resume(items, states)))
    assert sorted(got) == items  # 23 - 7 = 16 left: no padding on 2 ranks
    # the checksum is the pipeline's: a real state passes, an edited one does not
    assert all(_checksum({k: v for k, v in s.items() if k != "check"}) == s["check"]
               for s in states)
    states[1]["positions"]["mark"] = 4
    with pytest.raises(ConfigError, match="state 1 was edited or damaged"):
        remaining(states)


def _valid(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s, "check": _checksum({k: v for k, v in s.items() if k != "check"})}
            for s in states]


def _two_ranks(**options: Any) -> list[dict[str, Any]]:
    return [_state(share, [0]) for share in _shares(2, list(range(9)), None, **options)]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: [s[0]], r"no state for part\(s\) \[1\] of 2"),
        (lambda s: [s[0], s[0]], "two states for part 0"),
        (lambda s: [], "non-empty list"),
        (lambda s: s[0], "non-empty list"),
        (lambda s: [s[0], {**s[1], "check": "0"}], "state 1 was edited or damaged"),
        (lambda s: _valid([s[0], {**s[1], "split": None}]), "has no 'split'"),
        (lambda s: [s[0], _two_ranks(seed=5, shuffle=False)[1]], "seed differs"),
        (lambda s: [s[0], _two_ranks(remainder="drop")[1]], "remainder differs"),
        (lambda s: [s[0], _state(Split(rank=1, world_size=3)(list(range(9))), [])],
         "count differs"),
        (lambda s: [s[0], _state(Split(rank=1, world_size=2)(list(range(8))), [])],
         "n differs"),
        (lambda s: [s[0], _state(Split(rank=1, world_size=2)(list(range(1, 10))), [])],
         "listing differs"),
        (lambda s: _valid([s[0], {**s[1], "split": {**s[1]["split"], "epoch": 1}}]),
         "epoch differs"),
        (lambda s: _valid([s[0], {**s[1], "positions": {"mark": 9, "ranges": []}}]),
         "positions up to 9"),
        (lambda s: _valid([s[0], {**s[1], "split": {**s[1]["split"], "world_size": 0}}]),
         "state 1's split: rank 1 of world size 0, 2 parts"),
        (lambda s: _valid([s[0], {**s[1], "split": {**s[1]["split"], "world_size": 3}}]),
         "state 1's split: rank 1 of world size 3, 2 parts"),
        (lambda s: _valid([s[0], {**s[1], "split": {**s[1]["split"], "rank": 2}}]),
         "state 1's split: rank 2 of world size 2, 2 parts"),
    ],
)
def test_bad_states_say_what_is_wrong(edit: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Split(rank=0, world_size=3).resume(list(range(9)), edit(_two_ranks()))


def test_an_untouched_part_of_a_forged_world_size_is_refused() -> None:
    state = _two_ranks()[1]
    forged = _valid([{**state, "split": {**state["split"], "world_size": 0}}])[0]
    with pytest.raises(ConfigError, match="world size 0"):
        untouched_state(forged, 0)


def test_the_list_and_the_split_must_be_the_states() -> None:
    states = _two_ranks()
    with pytest.raises(ConfigError, match="another list"):
        Split(rank=0, world_size=3).resume(list(range(1, 10)), states)
    with pytest.raises(ConfigError, match="shuffle is True"):
        Split(rank=0, world_size=3, shuffle=True).resume(list(range(9)), states)


def _expanding(rank: int, world: int, items: list[int], taken: int) -> tuple[list[int], Any]:
    pipe = Pipeline(Split(rank=rank, world_size=world)(items)).flat_map(lambda x: [x, x + 100])
    it = iter(pipe)
    got = [next(it) for _ in range(taken)]
    state = json.loads(json.dumps(pipe.state_dict()))  # before the iterator is closed
    del it
    return got, state


def test_an_item_delivered_in_part_is_refused_or_read_again_whole() -> None:
    items = list(range(8))
    (got0, state0), (got1, state1) = _expanding(0, 2, items, 3), _expanding(1, 2, items, 2)
    assert got0 == [0, 100, 2] and got1 == [1, 101]  # rank 0's item 2 is half delivered
    with pytest.raises(ConfigError, match=r"delivered in part \(stage 'flat_map'.*partial="):
        Split(rank=0, world_size=1).resume(items, [state0, state1])
    share = Split(rank=0, world_size=1).resume(items, [state0, state1], partial="repeat")
    assert list(share) == [2, 3, 4, 5, 6, 7]  # 2 again whole: its output 2 repeats
    with pytest.raises(ConfigError, match="partial must be"):
        Split(rank=0, world_size=1).resume(items, [state0, state1], partial="skip")  # type: ignore[arg-type]


def test_states_after_different_resumes_do_not_mix() -> None:
    items = list(range(12))
    first = [_state(share, [0]) for share in _shares(2, items, None)]
    other = [_state(share, [0, 1]) for share in _shares(2, items, None)]
    one, two = _shares(3, items, first), _shares(3, items, other)
    mixed = [_state(one[0], []), _state(one[1], []), _state(two[2], [])]
    with pytest.raises(ConfigError, match=r"earlier resumes \(history\) differs"):
        remaining(mixed)
    edited = _valid([{**s, "split": {**s["split"], "history": [{"count": 2}]}}
                     for s in [*mixed[:2], _state(one[2], [])]])
    with pytest.raises(ConfigError, match="history holds a bad entry"):
        remaining(edited)


def test_a_resumed_state_stays_small() -> None:
    """The resumed share saves each earlier job's settled local positions (a watermark and
    what was in flight per part), not the epoch's settled items one by one."""
    items = list(range(100_000))
    shares = _shares(8, items, None)
    states = [_state(share, [*range(1000 + 37 * r), 5000 + r]) for r, share in enumerate(shares)]
    resumed = _shares(3, items, states)
    saved = json.dumps(_state(resumed[0], list(range(10))))
    assert len(saved) < 2000, len(saved)


def test_states_saved_with_the_sampled_listing_hash_still_resume() -> None:
    """States saved before every item was hashed (asyncflow before 22dfe86) hold a hash of
    the list's length and a sample of 64 items' reprs: they resume over that list, and are
    refused over another."""
    items = list(range(9))
    step = max(1, len(items) // 64)
    sample = "\n".join([str(len(items)), *(repr(items[i])[:200] for i in range(0, 9, step))])
    old = hashlib.sha256(sample.encode()).hexdigest()[:16]
    states = _valid([{**s, "split": {**s["split"], "listing": old}} for s in _two_ranks()])
    resumed = [list(Split(rank=r, world_size=3).resume(items, states)) for r in range(3)]
    # each of the two ranks settled its first item; "pad" repeats two of those left
    assert {x for share in resumed for x in share} == set(range(2, 9))
    with pytest.raises(ConfigError, match="another list"):
        Split(rank=0, world_size=3).resume([*items[:8], 99], states)
