"""A state identifies every item of the listing it was taken over, and its structure is
checked when it is loaded (issue 25, points 3 and 20)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline
from asyncflow._identity import describe_difference, sequence_identity
from asyncflow.pipeline import listing_identity
from asyncflow.pipeline import state_checksum as _checksum
from asyncflow.pipeline._resume import _sampled

pytestmark = pytest.mark.usefixtures("leak_check")


def _state(pipe: Pipeline, taken: int) -> dict[str, Any]:
    with pipe.open() as run:
        list(itertools.islice(run, taken))
        return json.loads(json.dumps(pipe.state_dict()))


def _forged(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``state`` with ``changes``, its checksum made again (as a forger would)."""
    body = {k: v for k, v in state.items() if k != "check"}
    body.update(changes)
    return {**body, "check": _checksum(body)}


@dataclass(frozen=True)
class Record:
    key: str
    size: int


@pytest.mark.parametrize(
    ("items", "changed"),
    [
        (list(range(1000)), lambda xs: [*xs[:37], -1, *xs[38:]]),
        ([f"s3://bucket/{i}.tar" for i in range(500)],
         lambda xs: [*xs[:400], "s3://bucket/x.tar", *xs[401:]]),
        ([{"path": f"{i}.jpg", "label": i % 3} for i in range(300)],
         lambda xs: [*xs[:101], {"path": "101.jpg", "label": 9}, *xs[102:]]),
        ([Record(str(i), i) for i in range(300)],
         lambda xs: [*xs[:250], Record("250", 7), *xs[251:]]),
    ],
)
def test_any_changed_item_of_a_sequence_is_found(items: list[Any], changed: Any) -> None:
    state = _state(Pipeline(items).batch(4), 3)
    Pipeline(list(items)).batch(4).load_state_dict(state)  # the same items resume
    with pytest.raises(ConfigError, match="its listing changed"):
        Pipeline(changed(items)).batch(4).load_state_dict(state)


def test_the_difference_is_named_where_it_starts() -> None:
    saved = sequence_identity([f"{i}.jpg" for i in range(1000)])
    here = sequence_identity([f"{i}.jpg" for i in range(1000) if i != 700])
    assert describe_difference(saved, here) == (
        "999 items here, 1000 in the state; the listing differs in items 672-703 (from "
        "\"'672.jpg'\"): their names differ")
    assert describe_difference(saved, saved) is None
    names = [f"{i}.jpg" for i in range(100)]
    contents = ["10:aa"] * 100
    changed = [*contents[:64], "10:ab", *contents[65:]]
    assert "the content of a file in items 64-67 (from '64.jpg') changed" in str(
        describe_difference(listing_identity(names, contents), listing_identity(names, changed)))


def test_the_identity_stays_small_and_is_taken_once_per_run() -> None:
    items = list(range(200_000))
    pipe = Pipeline(items).batch(8)
    with pipe.open() as run:
        next(run)
        first = pipe.state_dict()
        items[199_999] = -1  # a run reads its listing once: its states describe that one
        assert pipe.state_dict()["pipeline"] == first["pipeline"]
    assert len(json.dumps(first["pipeline"])) < 4000


def test_a_state_saved_with_a_sampled_listing_hash_still_loads() -> None:
    items = [str(i) for i in range(100)]
    state = _state(Pipeline(items).batch(4), 2)
    # the hash of 16 of its items (every 6th), as states saved before every item was hashed
    # hold it
    old = {**state["pipeline"], "source": {**state["pipeline"]["source"],
                                           "listing": _sampled(items)}}
    Pipeline(items).batch(4).load_state_dict(_forged(state, pipeline=old))
    with pytest.raises(ConfigError, match="a hash of 16 of its items"):
        Pipeline(["x", *items[1:]]).batch(4).load_state_dict(_forged(state, pipeline=old))


def _flat() -> Pipeline:
    return Pipeline(list(range(40))).flat_map(lambda x: [x] * 5).batch(3)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ({"flat_map": {"partial": "garbage"}}, r"nodes\['flat_map'\]\['partial'\] must be a list"),
        ({"flat_map": {"partial": [{"input": [["a", 1]], "done": {"mark": 1, "ranges": []}}]}},
         r"nodes\['flat_map'\]\['partial'\]\[0\]\['input'\] must be a list of \[start, stop\]"),
        ({"flat_map": {"partial": [{"input": [[3, 4]], "done": 7}]}},
         r"nodes\['flat_map'\]\['partial'\]\[0\]\['done'\]"),
        ({"flat_map": {"partial": [7]}}, r"\['partial'\]\[0\] must be a dict of input and done"),
        ({"flat_map": {"partial": [], "x": 1}}, r"nodes\['flat_map'\] has unknown fields"),
    ],
)
def test_forged_stage_extras_are_refused_on_load_naming_the_field(
    nodes: dict[str, Any], message: str
) -> None:
    state = _state(_flat(), 4)
    assert state["nodes"]  # an expansion delivered in part: the field being forged
    with pytest.raises(ConfigError, match=message):
        _flat().load_state_dict(_forged(state, nodes=nodes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"failed": {"map": "x"}}, "failed must map stage names to counts"),
        ({"offset": 3}, "offset must be its positions' mark"),
        ({"pipeline": {"source": [], "stages": []}}, "pipeline must hold source and stages"),
        ({"pipeline": {"source": {"type": "list", "len": 40, "listing": {"items": "x"}},
                       "stages": [["flat_map", "flat_map"], ["batch", "batch"]]}},
         "the state's source listing must hold items, digest and parts"),
        *[({"pipeline": {"source": {"type": "list", "len": 40, "listing": {
            "items": items, "digest": "d", "parts": []}},
                         "stages": [["flat_map", "flat_map"], ["batch", "batch"]]}},
           r"the state's source listing\['items'\] must be an int >= 0, got ")
          for items in (-1, True, "40", 40.0)],
    ],
)
def test_forged_fields_are_refused_on_load_naming_them(changes: dict[str, Any],
                                                       message: str) -> None:
    state = _state(_flat(), 4)
    with pytest.raises(ConfigError, match=message):
        _flat().load_state_dict(_forged(state, **changes))


def test_a_split_share_identifies_every_item_of_its_list() -> None:
    """A ``Split`` share's state (``load_state_dict``, and ``Split.resume`` on another world
    size) refuses a list changed anywhere, not only at the 64 items it used to hash."""
    from asyncflow import Split

    items = list(range(1000))
    changed = [*items[:501], -1, *items[502:]]  # not one of the items every 15th
    pipe = Pipeline(Split(rank=0, world_size=2)(items)).batch(4)
    state = _state(pipe, 2)
    Pipeline(Split(rank=0, world_size=2)(list(items))).batch(4).load_state_dict(state)
    with pytest.raises(ConfigError, match="its listing changed"):
        Pipeline(Split(rank=0, world_size=2)(changed)).batch(4).load_state_dict(state)
    other = _state(Pipeline(Split(rank=1, world_size=2)(items)).batch(4), 2)
    Split(rank=0, world_size=3).resume(items, [state, other])
    with pytest.raises(ConfigError, match="another list"):
        Split(rank=0, world_size=3).resume(changed, [state, other])


def test_a_range_is_identified_by_its_bounds() -> None:
    state = _state(Pipeline(range(1000)).batch(4), 3)
    Pipeline(range(1000)).batch(4).load_state_dict(state)
    with pytest.raises(ConfigError, match="item 0 is '1' here, '0' in the state"):
        Pipeline(range(1, 1001)).batch(4).load_state_dict(state)
    assert sequence_identity(range(10**9))["items"] == 10**9  # nothing listed one by one


def test_an_array_item_is_identified_by_its_bytes_where_they_say_what_it_holds() -> None:
    import numpy as np

    from asyncflow.pipeline import item_token

    torch = pytest.importorskip("torch")
    assert item_token(np.arange(3)) != item_token(np.arange(1, 4))
    assert item_token(np.arange(3)) == item_token(torch.arange(3))  # the same bytes
    # bfloat16 has no numpy dtype, an object array's bytes are addresses: type and shape
    assert item_token(torch.zeros(2, dtype=torch.bfloat16)) == "array(torch.bfloat16,[2])"
    assert item_token(np.array([object()])) == "array(object,[1])"
