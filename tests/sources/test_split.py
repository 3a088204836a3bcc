"""Split: one process's share of a list, across ranks and workers (asyncflow/ranks/_split.py)."""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from asyncflow import ConfigError, ConfigTypeError, Pipeline, Split, sources
from asyncflow.pipeline.seeding import epoch_rng
from asyncflow.ranks import Part, cut, padding
from tests.torchrun import free_port

WORLDS = range(1, 9)
LENGTHS = range(0, 1001)


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _shares(n: int, count: int, remainder: str) -> list[list[int]]:
    return [cut(n, i, count, remainder=remainder) for i in range(count)]  # type: ignore[arg-type]


def test_pad_property_disjoint_covering_equal_for_1_to_8_ranks_and_0_to_1000_items() -> None:
    for world in WORLDS:
        for n in LENGTHS:
            parts = _shares(n, world, "pad")
            sizes = {len(p) for p in parts}
            assert sizes == {-(-n // world)}, (world, n)
            counts = Counter(i for p in parts for i in p)
            assert set(counts) == set(range(n)), (world, n)  # covers everything
            repeats = padding(n, world)
            # exactly once, but for the padding: the first `repeats` items, once more each
            assert sum(counts.values()) - n == repeats, (world, n)
            assert [i for i, c in counts.items() if c > 1] == list(range(min(repeats, n)))
            # the k-th item of rank r is padding when r + k * world >= n: the others are
            # disjoint across ranks and hold every item exactly once
            real = [i for rank, p in enumerate(parts) for k, i in enumerate(p)
                    if rank + k * world < n]
            assert sorted(real) == list(range(n)), (world, n)


def test_drop_property_disjoint_equal_and_only_the_tail_left_out() -> None:
    for world in WORLDS:
        for n in LENGTHS:
            parts = _shares(n, world, "drop")
            assert {len(p) for p in parts} == {n // world}, (world, n)
            taken = [i for p in parts for i in p]
            assert len(taken) == len(set(taken)), (world, n)  # disjoint, no repeats
            assert sorted(taken) == list(range(n - n % world)), (world, n)
            assert padding(n, world, remainder="drop") == n % world


def test_the_rule_is_distributed_samplers() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    for world in (1, 3, 4, 7):
        for n in (0, 1, 5, 10, 23):
            for drop in (False, True):
                for rank in range(world):
                    sampler = torch_data.DistributedSampler(
                        range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop)
                    ours = cut(n, rank, world, remainder="drop" if drop else "pad")
                    if n:
                        assert ours == list(sampler), (world, n, drop, rank)


def test_workers_split_each_rank_again() -> None:
    n, world, workers = 103, 3, 4
    parts = [Part(rank, world, worker, workers).positions(n)
             for rank in range(world) for worker in range(workers)]
    assert {len(p) for p in parts} == {9}  # ceil(103 / 12)
    assert set().union(*map(set, parts)) == set(range(n))
    per_rank = [[i for w in range(workers) for i in parts[r * workers + w]] for r in range(world)]
    assert {len(p) for p in per_rank} == {36}


def test_explicit_rank_and_world_size() -> None:
    items = [f"shard-{i:02d}.tar" for i in range(10)]
    shares = [list(Split(rank=r, world_size=4)(items)) for r in range(4)]
    assert shares[0] == ["shard-00.tar", "shard-04.tar", "shard-08.tar"]
    assert shares[3] == ["shard-03.tar", "shard-07.tar", "shard-01.tar"]  # padded: 01 repeats
    assert [len(Split(rank=r, world_size=4)(items)) for r in range(4)] == [3, 3, 3, 3]
    dropped = [Split(rank=r, world_size=4, remainder="drop").take(items) for r in range(4)]
    assert dropped[1] == ["shard-01.tar", "shard-05.tar"]
    assert sorted(x for d in dropped for x in d) == items[:8]  # the last two are left out


def test_environment_gives_rank_and_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert Split().part() == Part(1, 2)
    assert Split().take(list(range(5))) == [1, 3, 0]
    assert Split(rank=0).part() == Part(0, 2)  # what is given wins over the environment
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="rank 2 of world_size 2"):
        Split().part()


def test_without_anything_it_is_the_whole_list() -> None:
    assert Split().part() == Part(0, 1)
    assert list(Split()(range(4))) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size must be an int >= 1 or None, got 0"),
        ({"rank": -1}, "rank must be an int >= 0, got -1"),
        ({"rank": 2, "world_size": 2}, r"rank 2 is outside \[0, 1\] \(world_size=2\)"),
        ({"remainder": "wrap"}, "remainder must be 'pad' or 'drop', got 'wrap'"),
    ],
)
def test_bad_input_names_the_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Split(**kwargs)  # type: ignore[arg-type]


def test_bad_types() -> None:
    with pytest.raises(ConfigTypeError, match="rank must be an int >= 0, got '1'"):
        Split(rank="1")  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match="world_size must be an int >= 1 or None, got True"):
        Split(world_size=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"part index 3 is outside \[0, 2\]"):
        cut(10, 3, 3)


@pytest.fixture
def process_group() -> Iterator[None]:
    """A one-rank gloo group on loopback, destroyed afterwards."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("process_group")
def test_the_initialized_group_is_read_and_a_contradiction_refused() -> None:
    assert Split().part() == Part(0, 1)
    assert Split(rank=0, world_size=1).part() == Part(0, 1)
    with pytest.raises(ConfigError, match=r"Split\(rank=1, world_size=2\) contradicts .* "
                                          r"\(rank 0 of 1\)"):
        Split(rank=1, world_size=2).part()
    with pytest.raises(ConfigError, match=r"Split\(rank=None, world_size=4\) contradicts"):
        Split(world_size=4).take([1, 2])


def test_a_share_is_resolved_at_each_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    shards = Split()(["a", "b", "c"])
    assert list(shards) == ["a", "b", "c"]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert list(shards) == ["b", "a"]
    assert len(shards) == 2


def test_a_share_feeds_a_pipeline_every_epoch() -> None:
    pipe = Pipeline(Split(rank=1, world_size=3)(range(10))).map(lambda i: i * 10)
    assert list(pipe) == [10, 40, 70, 0]
    assert list(pipe) == [10, 40, 70, 0]


class _Listing:
    """An iterable that is not a sequence (a directory walk, say), counting its reads."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __iter__(self) -> Iterator[int]:
        self.reads += 1
        return iter(range(self.n))


def test_a_listing_that_is_not_a_sequence_is_read_once_per_iteration() -> None:
    # len() read the listing again (each state_dict() asks it), and a one-shot generator's
    # second read is empty: a state saved mid-run said 0 items, which no resume matched.
    listing = _Listing(20)
    share = Split(rank=0, world_size=2)(listing)
    assert len(share) == 10 and list(share) == list(range(0, 20, 2)) and listing.reads == 1
    assert len(share) == 10 and listing.reads == 1  # the listing the iteration dealt
    pipe = Pipeline(Split(rank=0, world_size=2)(x for x in range(20)))
    with pipe.open() as run:
        head = [next(run) for _ in range(3)]
        state = pipe.state_dict()
    assert state["pipeline"]["source"]["len"] == 10 and state["split"]["n"] == 20
    resumed = Pipeline(Split(rank=0, world_size=2)(x for x in range(20)))
    resumed.load_state_dict(state)  # its checks read the listing the run then deals
    assert head + list(resumed) == list(range(0, 20, 2))


async def test_an_async_listing_is_read_whole_then_shared(
    tmp_path: pathlib.Path, warm_executor: None, async_leak_check: None
) -> None:
    for i in range(7):
        (tmp_path / f"{i}.bin").write_bytes(b"x")
    everything = [x async for x in sources.list_objects(tmp_path)]
    parts = [[x async for x in sources.list_objects(tmp_path, split=Split(rank=r, world_size=3))]
             for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert parts[0] == everything[0::3]
    # 7 in 3 parts: 2 repeats, the list's first two items, on the parts that end short
    assert parts[1] == [everything[1], everything[4], everything[0]]
    assert parts[2] == [everything[2], everything[5], everything[1]]
    via_call = [x async for x in Split(rank=1, world_size=3)(sources.list_objects(tmp_path))]
    assert via_call == parts[1]


def test_list_objects_refuses_another_split() -> None:
    with pytest.raises(ConfigTypeError, match=r"split must be an asyncflow\.Split"):
        sources.list_objects("/tmp", split=2)  # type: ignore[call-overload]


def test_shuffle_cuts_the_same_order_on_every_rank_and_a_new_one_each_epoch() -> None:
    items = list(range(50))
    for world in (1, 3, 4):
        for epoch in (0, 1):
            parts = [Split(rank=r, world_size=world, shuffle=True, seed=5).take(items, epoch=epoch)
                     for r in range(world)]
            assert {len(p) for p in parts} == {-(-50 // world)}
            assert set().union(*map(set, parts)) == set(items)
            order = list(epoch_rng(5, epoch).permutation(50))
            real = [i for r, p in enumerate(parts) for k, i in enumerate(p) if r + k * world < 50]
            assert sorted(real) == items  # disjoint, but for the padding
            assert parts[0][0] == order[0]
    split = Split(rank=1, world_size=2, shuffle=True, seed=5)
    shards = split(items)
    first = list(shards)
    assert list(shards) == first  # the epoch does not advance by itself
    shards.set_epoch(1)
    assert list(shards) != first
    assert list(shards) == split.take(items, epoch=1) == list(split(items, epoch=1))
    with pytest.raises(ConfigError, match="epoch must be an int >= 0, got -1"):
        shards.set_epoch(-1)
    with pytest.raises(ConfigTypeError, match=r"seed must be an int, got 1\.5"):
        Split(shuffle=True, seed=1.5)  # type: ignore[arg-type]


def _shard(index: int) -> bytes:
    """A tar shard of ``index + 1`` samples (shards of different lengths, as in practice)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for j in range(index + 1):
            data = f"{index}-{j}".encode()
            member = tarfile.TarInfo(f"s{index:02d}/{j:03d}.txt")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return out.getvalue()


async def test_tar_shards_listed_on_s3_are_split_by_rank(
    s3: Any, bucket: str, warm_executor: None, async_leak_check: None
) -> None:
    for index in range(5):
        await s3.put_object(Bucket=bucket, Key=f"shards/{index:02d}.tar", Body=_shard(index))
    prefix = f"s3://{bucket}/shards/"
    for world in (2, 3):
        seen: list[list[str]] = []
        for rank in range(world):
            split = Split(rank=rank, world_size=world)
            pipe = Pipeline(lambda split=split: sources.list_objects(prefix, split=split))
            seen.append([s["txt"].decode() async for s in pipe.flat_map(sources.tar_samples)])
        shards = [cut(5, rank, world) for rank in range(world)]
        assert {len(s) for s in shards} == {-(-5 // world)}  # the same number of shards
        for rank in range(world):
            assert seen[rank] == [f"{i}-{j}" for i in shards[rank] for j in range(i + 1)]
        everything = {f"{i}-{j}" for i in range(5) for j in range(i + 1)}
        assert set().union(*map(set, seen)) == everything
        # Shards differ in length, so sample counts differ: even_steps evens the batches.
        assert len({len(s) for s in seen}) > 1


def test_splitting_imports_neither_torch_nor_numpy() -> None:
    code = ("import sys, asyncflow\n"
            "from asyncflow import Split, sources\n"
            "assert Split(world_size=2, rank=1).take([1, 2, 3]) == [2, 1]\n"
            "sources.list_objects('.', split=Split())\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, cwd=pathlib.Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
