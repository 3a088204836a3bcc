"""Replay: batching again, shuffling by index, and the types of replayed leaves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncflow.cache._format import CacheInvalid, remove_cache
from asyncflow.cache._reader import Reader, map_shared
from asyncflow.cache._replay import Deferred, KeptMapping, _gather, finish, permutation, replay

from .test_reader import batches, write


def test_batches_come_back_at_the_upstream_size_with_the_short_last(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    out = list(replay(Reader.open(tmp_path / "c")))
    assert [b[1].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for images, labels in out:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert torch.equal(images[:, 0, 0, 0].long(), labels)


def test_full_batches_only_when_upstream_dropped_the_last(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(12, 4))  # what drop_last=True leaves of 14 samples
    order = permutation(12, 5)
    out = list(replay(Reader.open(tmp_path / "c"), order))
    assert [len(b[1]) for b in out] == [4, 4, 4]


def test_shuffle_by_index_visits_every_sample_once(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    reader = Reader.open(tmp_path / "c")
    out = list(replay(reader, permutation(10, 1)))
    labels = torch.cat([b[1] for b in out]).tolist()
    assert sorted(labels) == list(range(10)) and labels != list(range(10))
    assert [len(b[1]) for b in out] == [4, 4, 2]
    for images, ids in out:  # rows stay together across fields
        assert torch.equal(images[:, 2, 3, 4].long(), ids)
        assert not np.shares_memory(images.numpy(), reader.arrays[0])


def test_permutation_is_reproducible() -> None:
    assert permutation(50, 3).tolist() == permutation(50, 3).tolist()
    assert permutation(50, [3, 0]).tolist() != permutation(50, [3, 1]).tolist()


def test_samples_keep_their_python_and_numpy_types(tmp_path: Path) -> None:
    items = [{"x": np.full(3, i, "f4"), "n": i, "f": i / 2, "b": i % 2 == 0, "s": np.int16(i)}
             for i in range(5)]
    write(tmp_path / "c", items, layout="samples")
    out = list(replay(Reader.open(tmp_path / "c")))
    assert len(out) == 5
    for i, item in enumerate(out):
        assert type(item["n"]) is int and item["n"] == i
        assert type(item["f"]) is float and item["f"] == i / 2
        assert type(item["b"]) is bool and item["b"] == (i % 2 == 0)
        assert isinstance(item["s"], np.int16) and item["s"] == i
        assert isinstance(item["x"], np.ndarray) and item["x"].tolist() == [i] * 3


def test_zero_dim_arrays_and_tensors_come_back_as_such(tmp_path: Path) -> None:
    # A label as torch.tensor(3), a loss weight as np.array(0.5), a np.str_ tag: one row of a
    # field of shape () is still an array (indexing [i] alone gave a numpy scalar, which
    # torch.from_numpy refused and scalar leaves could not index).
    items = [{"t": torch.tensor(i), "a": np.array(i / 2), "s": np.str_(f"n{i}")}
             for i in range(5)]
    write(tmp_path / "c", items, layout="samples")
    reader = Reader.open(tmp_path / "c")
    for order in (None, permutation(5, 1)):
        out = list(replay(reader, order))
        ids = range(5) if order is None else order.tolist()
        for i, item in zip(ids, out, strict=True):
            assert isinstance(item["t"], torch.Tensor) and item["t"].shape == ()
            assert item["t"].item() == i
            assert isinstance(item["a"], np.ndarray) and item["a"].shape == ()
            assert item["a"] == i / 2
            assert isinstance(item["s"], np.str_) and item["s"] == f"n{i}"
    lists = [[(torch.tensor(i), np.array(i))] for i in range(3)]
    write(tmp_path / "l", lists, layout="lists")
    assert [[(t.shape, a.shape) for t, a in b] for b in replay(Reader.open(tmp_path / "l"))] \
        == [[((), ())]] * 3


def test_lists_of_samples_come_back_as_lists(tmp_path: Path) -> None:
    items = [[(np.full(2, i), i) for i in range(s, min(s + 3, 7))] for s in range(0, 7, 3)]
    write(tmp_path / "c", items, layout="lists")
    reader = Reader.open(tmp_path / "c")
    assert reader.count == 7 and reader.batch_size == 3
    out = list(replay(reader))
    assert [[label for _, label in batch] for batch in out] == [[0, 1, 2], [3, 4, 5], [6]]
    shuffled = list(replay(reader, permutation(7, 0)))
    assert sorted(label for batch in shuffled for _, label in batch) == list(range(7))


def test_shuffled_buffers_are_reused_only_once_the_consumer_lets_go(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(64, 4))
    reader = Reader.open(tmp_path / "c")
    kept, seen = [], set()
    for i, (images, ids) in enumerate(replay(reader, permutation(64, 2))):
        seen.add(images.data_ptr())
        if i % 2 == 0:
            kept.append((images, ids, ids.clone()))
        del images, ids
    assert len(seen) < 16  # the dropped batches' buffers came round again
    for images, ids, copy in kept:  # the kept ones were never overwritten
        assert torch.equal(ids, copy)
        assert torch.equal(images[:, 1, 2, 3].long(), copy)


def test_deferred_batches_are_copied_by_finish_when_asked(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(12, 4))
    order = permutation(12, 5)
    expected = [b[1].tolist() for b in replay(Reader.open(tmp_path / "c"), order)]
    reader = Reader.open(tmp_path / "c")
    items = list(replay(reader, order, defer=True))  # no copy made yet: nothing to hold
    assert [type(item) for item in items] == [Deferred] * 3
    assert "deferred" in repr(items[0])
    out = [finish(item) for item in items]
    assert [ids.tolist() for _, ids in out] == expected
    for images, ids in out:
        assert torch.equal(images[:, 0, 0, 0].long(), ids)
    in_order = list(replay(reader, defer=True))  # zero-copy slices need no deferring
    assert all(type(item) is tuple for item in in_order)
    assert finish(in_order[0]) is in_order[0] and finish(7) == 7


def test_a_read_only_mapping_is_copied_even_in_stored_order(tmp_path: Path) -> None:
    # What Reader.open falls back to where the kernel refuses private mappings.
    write(tmp_path / "c", batches(10, 4))
    mapped = Reader.open(tmp_path / "c")
    reader = dataclasses.replace(mapped, arrays=map_shared(mapped), copy=True)
    items = list(replay(reader, defer=True))
    assert [type(item) for item in items] == [Deferred] * 3
    out = [finish(item) for item in items]
    assert [ids.tolist() for _, ids in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    images = out[0][0]
    images.fill_(9)  # a copy of its own: writeable, and the cache keeps its bytes
    assert reader.arrays[0][0, 0, 0, 0] == 0
    assert [ids.tolist() for _, ids in replay(reader)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bool", "int64", "uint16", ">i4"])
@pytest.mark.parametrize("writeable", [True, False])
def test_gather_copies_the_rows_in_order_for_any_dtype(dtype: str, writeable: bool) -> None:
    # uint16, a big-endian int and a read-only mapping take numpy's path, the rest torch's
    array = (np.arange(7 * 3 * 2) % 200).astype(dtype).reshape(7, 3, 2)
    array.flags.writeable = writeable
    rows = np.array([6, 0, 3, 3, 5])
    out = np.zeros((5, 3, 2), dtype)
    assert _gather(array, rows, out) is out
    np.testing.assert_array_equal(out, array[rows])


def _ids(reader: Reader, order: np.ndarray, kept: KeptMapping) -> list[int]:
    return [int(i) for _, ids in replay(reader, order, kept=kept) for i in ids]


def test_shuffled_epochs_keep_one_read_only_mapping(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(64, 8))
    kept, order = KeptMapping(), permutation(64, 1)
    first = Reader.open(tmp_path / "c")
    sources = kept.mapped(first)[1]
    assert all(not a.flags.writeable for a in map_shared(first))  # nothing writes through
    for _ in range(3):  # each epoch checks the cache again, and reads through the kept views
        reader = Reader.open(tmp_path / "c")
        assert kept.mapped(reader)[1] is sources
        assert _ids(reader, order, kept) == order.tolist()


def test_a_rebuilt_cache_is_mapped_anew(tmp_path: Path) -> None:
    path = tmp_path / "c"
    write(path, batches(64, 8))
    kept, order = KeptMapping(), permutation(64, 1)
    assert _ids(Reader.open(path), order, kept) == order.tolist()
    remove_cache(path)
    rebuilt = [(images + 100, ids + 100) for images, ids in batches(64, 8)]
    write(path, rebuilt)
    reader = Reader.open(path)
    assert _ids(reader, order, kept) == (order + 100).tolist()
    images = next(iter(replay(reader, order, kept=kept)))[0]
    assert images[:, 0, 0, 0].tolist() == (order[:8] + 100).tolist()


def test_writes_into_stored_order_batches_never_reach_a_shuffled_epoch(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(16, 4))
    kept = KeptMapping()
    kept.mapped(Reader.open(tmp_path / "c"))  # mapped before the writes
    for images, ids in replay(Reader.open(tmp_path / "c"), kept=kept):  # zero-copy slices
        images.fill_(255)
        ids.fill_(-1)
    order = permutation(16, 3)
    shuffled = list(replay(Reader.open(tmp_path / "c"), order, kept=kept))
    assert [int(i) for _, ids in shuffled for i in ids] == order.tolist()
    assert all(int(images.max()) < 16 for images, _ in shuffled)


def test_a_cache_replaced_after_its_check_is_read_through_the_checked_mapping(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c"
    write(path, batches(16, 4))
    reader = Reader.open(path)  # checked and mapped: the files of this moment
    remove_cache(path)
    write(path, [(images + 100, ids + 100) for images, ids in batches(16, 4)])
    with pytest.raises(CacheInvalid, match="changed"):
        map_shared(reader)
    kept, order = KeptMapping(), permutation(16, 5)
    assert kept.mapped(reader)[1] is reader.arrays
    assert _ids(reader, order, kept) == order.tolist()  # the checked cache, consistently
