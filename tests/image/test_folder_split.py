"""image.folder(split=...): each rank reads its share of the tree (asyncflow/image/_listing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncflow import ConfigError, ConfigTypeError, Split, image
from asyncflow.ranks import cut

from ._pictures import write_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 5, "dog": 4, "ant": 3})  # 12 images
    return root


def _rows(pipe: object) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*pipe, strict=True)  # type: ignore[call-overload]
    return torch.cat(xs), torch.cat(ys)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize(("world", "remainder"), [(5, "pad"), (5, "drop"), (3, "pad")])
def test_each_rank_reads_its_positions_of_the_same_epoch_order(
    tree: Path, train: bool, world: int, remainder: str
) -> None:
    options = {"batch_size": 2, "size": 16, "train": train, "decode_concurrency": 2,
               "workers": "threads"}
    everything, labels = _rows(image.folder(tree, seed=0, **options))  # type: ignore[arg-type]
    counts = set()
    for rank in range(world):
        split = Split(rank=rank, world_size=world, remainder=remainder)  # type: ignore[arg-type]
        pipe = image.folder(tree, split=split, **options)  # type: ignore[arg-type]
        xs, ys = _rows(pipe)
        positions = cut(12, rank, world, remainder=remainder)  # type: ignore[arg-type]
        # the same images, crops and labels as the unsplit epoch at this rank's positions
        assert torch.equal(xs, everything[positions]), (rank, world)
        assert torch.equal(ys, labels[positions])
        assert len(pipe) == -(-len(positions) // 2)
        counts.add(len(list(pipe)))
    assert len(counts) == 1  # every rank: the same number of batches


def test_a_split_is_resolved_when_the_folder_is_built(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, split=Split(rank=1, world_size=2))
    assert pipe.part is not None and (pipe.part.rank, pipe.part.world_size) == (1, 2)
    assert pipe.part.num_workers == 1  # one pipeline per rank: workers are not counted
    assert len(pipe.samples) == 12 and len(pipe) == 2


def test_a_split_must_be_a_split(tree: Path) -> None:
    with pytest.raises(ConfigTypeError, match=r"split must be an asyncflow\.Split, got 2"):
        image.folder(tree, batch_size=4, size=16, split=2)  # type: ignore[arg-type]


def test_the_folder_shuffles_not_the_split(tree: Path) -> None:
    with pytest.raises(ConfigError, match=r"image\.folder shuffles with its own shuffle="):
        image.folder(tree, batch_size=4, size=16, split=Split(world_size=2, shuffle=True))
