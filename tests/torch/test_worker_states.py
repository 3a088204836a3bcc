"""Elastic resume from DataLoader worker processes (``asyncflow.torch.worker_states``,
``gather_states`` over a loader's state): each (rank, worker) part's pipeline state is taken
from the loader's ``state_dict()``, and ``Split.resume`` cuts what they left between another
number of ranks and workers. Ranks are simulated in one process (explicit rank and world size);
the workers are real processes.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from asyncflow import ConfigError, DataLoader, Pipeline, Split
from asyncflow.ranks import remaining
from asyncflow.torch import gather_states, worker_states
from tests.torchrun import torchrun

N = 24
WORKER = Path(__file__).with_name("_worker_states_worker.py")


class _Elastic(IterableDataset[int]):
    """Items ``0..N-1``: a ``Split`` share (cut by rank, then by worker) through a pipeline,
    resumed from ``states`` when given; its ``state_dict()`` is its pipeline's. Without a
    rank and world size, ``Split()`` finds them (``$RANK`` under ``torchrun``)."""

    def __init__(self, rank: int | None, world_size: int | None,
                 states: Sequence[dict[str, Any]] | None = None) -> None:
        self.rank, self.world_size, self.states = rank, world_size, states
        self.pipe: Pipeline[int] | None = None

    def __iter__(self) -> Iterator[int]:
        split = Split(rank=self.rank, world_size=self.world_size)
        items = list(range(N))
        share = split(items) if self.states is None else split.resume(items, self.states)
        self.pipe = Pipeline(share).map(int)
        return iter(self.pipe)

    def state_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipe.state_dict() if self.pipe is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to load: an elastic resume starts from ``Split.resume``."""


def _read(dataset: _Elastic, workers: int, batches: int | None) -> tuple[list[int], Any]:
    loader: Any = DataLoader(dataset, batch_size=2, num_workers=workers,
                             workers="processes" if workers else "threads")
    it = iter(loader)
    try:
        got = [int(x) for batch in itertools.islice(it, batches) for x in batch]
        state = json.loads(json.dumps(loader.state_dict()))
    finally:
        it.close()
    return got, state


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.timeout(120)
def test_saved_with_2_ranks_of_2_workers_resumed_with_3_workers_then_1(leak_check: None) -> None:
    # job 1: 2 ranks x 2 worker processes (4 parts of 6), 3 batches of 2 taken on each rank
    delivered, states = [], []
    for rank in range(2):
        got, loader_state = _read(_Elastic(rank, 2), 2, 3)
        delivered += got
        states += gather_states(loader_state)  # no process group: this rank's workers
    assert [s["split"]["index"] for s in states] == [0, 1, 2, 3]
    assert len(delivered) == 12
    # job 2: 1 rank x 3 worker processes; one batch taken, so two workers delivered nothing
    got, loader_state = _read(_Elastic(0, 1, states), 3, 1)
    delivered += got
    again = worker_states(loader_state)
    assert [s["split"]["index"] for s in again] == [0, 1, 2]
    assert [s["positions"] for s in again[1:]] == [{"mark": 0, "ranges": []}] * 2
    assert remaining(again).left() and len(got) == 2
    # job 3: one process, no workers: the rest, exactly once
    got, _ = _read(_Elastic(0, 1, again), 0, None)
    delivered += got
    assert sorted(delivered) == list(range(N)), Counter(delivered)


def test_worker_states_refuses_what_is_not_a_loaders_state() -> None:
    with pytest.raises(ConfigError, match=r"takes the state_dict\(\) of an asyncflow"):
        worker_states({"epoch": 0, "batches": 1})
    lanes = {"epoch": 0, "batches": 0, "iterable": {"lanes": [{"state": None}], "next": 0}}
    with pytest.raises(ConfigError, match="no worker's dataset state holds a pipeline state"):
        worker_states(lanes)
    two = {"a": {"positions": {}, "check": "x"}, "b": {"positions": {}, "check": "y"}}
    lanes["iterable"]["lanes"] = [{"state": {"dataset": two}}]  # type: ignore[index]
    with pytest.raises(ConfigError, match="worker 0's dataset state holds 2 pipeline states"):
        worker_states(lanes)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_torchrun_2_ranks_of_2_workers_resume_on_3_ranks(tmp_path: Path) -> None:
    saved_dir, resumed_dir = tmp_path / "save", tmp_path / "resume"
    saved_dir.mkdir()
    resumed_dir.mkdir()
    saved = torchrun(WORKER, 2, saved_dir, "save")
    states = json.loads((saved_dir / "states.json").read_text())
    assert [(s["split"]["rank"], s["split"]["index"]) for s in states] == [
        (0, 0), (0, 1), (1, 2), (1, 3)]
    resumed = torchrun(WORKER, 3, resumed_dir, "resume", str(saved_dir / "states.json"))
    assert [len(r["delivered"]) for r in resumed] == [4, 4, 4]
    delivered = [item for r in saved + resumed for item in r["delivered"]]
    assert sorted(delivered) == list(range(N)), Counter(delivered)
