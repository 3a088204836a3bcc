"""Tar shards resume exactly: ``Pipeline(shards).flat_map(sources.tar_samples)`` interrupted
part-way, over files and over HTTP, yields exactly the samples not yet delivered."""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any

import pytest

from asyncflow import Pipeline, sources
from tests.servers import FaultServer

from .test_tar import make_tar


def _shards(put: Any) -> list[str]:
    return [put(s, make_tar([(f"s{s}/{i:03d}.txt", f"{s}-{i}".encode()) for i in range(23)]))
            for s in range(5)]


def _pipe(shards: list[str], ordered: bool) -> Pipeline[Any]:
    return Pipeline(shards).flat_map(sources.tar_samples, concurrency=2, ordered=ordered)


def _key(sample: dict[str, Any]) -> str:
    return f"{sample['__url__']}#{sample['__key__']}"


def _check(shards: list[str], ordered: bool) -> None:
    full = [_key(x) for x in _pipe(shards, ordered)]
    assert len(full) == 115
    for k in (0, 1, 22, 23, 40, 114, 115):
        first = _pipe(shards, ordered)
        with first.open() as run:
            head = [_key(next(run)) for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))
        resumed = _pipe(shards, ordered)
        resumed.load_state_dict(state)
        rest = [_key(x) for x in resumed]
        if ordered:
            assert head + rest == full, k
        else:
            assert Counter(head + rest) == Counter(full) and len(head + rest) == 115, k


@pytest.mark.parametrize("ordered", [True, False])
def test_tar_shards_on_disk_resume_exactly(tmp_path: pathlib.Path, ordered: bool) -> None:
    def put(s: int, data: bytes) -> str:
        path = tmp_path / f"{s}.tar"
        path.write_bytes(data)
        return str(path)

    _check(_shards(put), ordered)


@pytest.mark.parametrize("ordered", [True, False])
def test_tar_shards_over_http_resume_exactly(
    http_server: FaultServer, unique: str, ordered: bool
) -> None:
    _check(_shards(lambda s, data: http_server.put(f"{unique}/{s}.tar", data)), ordered)
