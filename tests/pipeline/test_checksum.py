"""One state checksum (issue 24): a pipeline's state, a merge's and a ``Split`` share's are
signed by ``asyncflow.pipeline.state_checksum``, and elastic resume checks them with it."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import pytest

import asyncflow
from asyncflow import ConfigError, Pipeline
from asyncflow.pipeline import state_checksum
from asyncflow.ranks import _elastic

pytestmark = pytest.mark.usefixtures("leak_check")


def _body(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "check"}


def _taken(pipe: Pipeline[Any], count: int) -> dict[str, Any]:
    with pipe.open() as run:
        list(itertools.islice(run, count))
        return json.loads(json.dumps(pipe.state_dict()))


def test_the_checksum_is_the_sha256_of_the_canonical_json() -> None:
    body = {"b": [1, 2], "a": {"z": "é", "y": None}}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert state_checksum(body) == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_a_state_with_stage_extras_is_signed_with_it() -> None:
    # flat_map's partial expansions take the incremental path (texts already at hand)
    pipe = Pipeline(range(50)).flat_map(lambda x: [x] * 3).map(lambda x: x, ordered=False)
    state = _taken(pipe, 20)
    assert state["check"] == state_checksum(_body(state))


def test_elastic_resume_checks_with_the_same_checksum() -> None:
    items = list(range(40))
    shares = [asyncflow.Split(rank=r, world_size=2)(items) for r in range(2)]
    states = [_taken(Pipeline(share), 5) for share in shares]
    assert all(s["check"] == state_checksum(_body(s)) for s in states)
    assert _elastic.state_checksum is state_checksum  # not a copy that could drift
    assert len(_elastic.remaining(states).left()) == 30
    edited = {**states[0], "positions": {"mark": 9, "ranges": []}}
    with pytest.raises(ConfigError, match="checksum"):
        _elastic.remaining([edited, states[1]])
