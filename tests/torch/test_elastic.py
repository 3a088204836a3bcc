"""Elastic resume under a real ``torchrun`` (gloo, CPU, loopback): an epoch saved on 3 ranks
resumes on 2, and one saved on 2 resumes on 3 (``Split.resume``, ``gather_states``; the rank
side is tests/torch/_elastic_worker.py).

Each run is a subprocess with a timeout; the test checks its exit code, every rank's result
file, and that no process of the run is left behind.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncflow.ranks import settled_of
from asyncflow.torch import gather_states
from tests.torchrun import torchrun

WORKER = Path(__file__).with_name("_elastic_worker.py")
N = 25  # as in the worker


def _torchrun(ranks: int, out: Path, *args: str) -> list[dict[str, Any]]:
    out.mkdir()
    return torchrun(WORKER, ranks, out, *args)


def _not_padding(result: dict[str, Any]) -> list[int]:
    """The items a rank delivered, less ``"pad"`` repeats: local position ``j`` of part
    ``index`` of ``count`` repeats an item when ``index + j * count`` is past the items
    that were left to cut (all ``n``, or those the saved states had not settled)."""
    split = result["split"]
    n, count, index = split["n"], split["count"], split["index"]
    done = len(settled_of(n, split["history"]) or ())
    return [item for j, item in enumerate(result["delivered"]) if index + j * count < n - done]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3)])
def test_an_epoch_saved_on_some_ranks_resumes_on_others_exactly_once(
    tmp_path: Path, before: int, after: int
) -> None:
    saved = _torchrun(before, tmp_path / "save", "save")
    states = json.loads((tmp_path / "save" / "states.json").read_text())
    assert [s["split"]["rank"] for s in states] == list(range(before))
    assert len({len(r["delivered"]) for r in saved}) == before  # each stopped at its own step
    resumed = _torchrun(after, tmp_path / "resume", "resume",
                        str(tmp_path / "save" / "states.json"))
    assert len({len(r["delivered"]) for r in resumed}) == 1  # equal counts on the new ranks
    delivered = [item for r in saved + resumed for item in _not_padding(r)]
    assert sorted(delivered) == list(range(N)), Counter(delivered)
    everything = [item for r in saved + resumed for item in r["delivered"]]
    left = N - sum(len(r["delivered"]) for r in saved)
    assert len(everything) - N == (-left) % after  # the only repeats are the padding


def test_gather_states_without_a_process_group_is_this_rank_alone() -> None:
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    state = {"positions": {"mark": 1, "ranges": []}}
    assert gather_states(state) == [state]
