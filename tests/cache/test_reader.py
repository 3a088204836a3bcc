"""The on-disk format: writing, committing, checking and mapping a cache."""

from __future__ import annotations

import dataclasses
import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import ConfigError
from asyncflow.cache import _reader
from asyncflow.cache._format import (
    HEADER_BYTES,
    CacheInvalid,
    leftovers,
    manifest_digest,
    remove_cache,
)
from asyncflow.cache._reader import Reader
from asyncflow.cache._replay import replay
from asyncflow.cache._writer import Writer


def batches(count: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for start in range(0, count, size):
        ids = torch.arange(start, min(start + size, count))
        images = ids.view(-1, 1, 1, 1).expand(-1, 3, 4, 5).to(torch.uint8).contiguous()
        out.append((images, ids))
    return out


def write(path: Path, items: list[Any], layout: str = "batches") -> Writer:
    writer = Writer(path, layout=layout, meta={"fingerprint": "test"})
    for item in items:
        writer.write(item)
    writer.commit()
    return writer


def test_commit_publishes_a_complete_cache_and_nothing_before(tmp_path: Path) -> None:
    path = tmp_path / "c"
    writer = Writer(path, layout="batches", meta={})
    writer.write(batches(4, 4)[0])
    assert not path.exists() and leftovers(path) == [writer.tmp]
    writer.commit()
    assert path.is_dir() and leftovers(path) == []
    assert sorted(p.name for p in path.iterdir()) == [
        "field0.crc32", "field0.npy", "field1.crc32", "field1.npy", "manifest.json"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["count"] == 4 and manifest["batch_size"] == 4
    assert manifest["layout"] == "batches"


def test_fields_are_standard_npy_files(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    images = np.load(tmp_path / "c" / "field0.npy", mmap_mode="r")
    labels = np.load(tmp_path / "c" / "field1.npy")
    assert images.shape == (10, 3, 4, 5) and images.dtype == np.uint8
    assert labels.tolist() == list(range(10))
    assert images.offset == HEADER_BYTES  # page-aligned data


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "c", layout="batches", meta={})
    writer.write(batches(4, 4)[0])
    writer.abort()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_reader_maps_what_was_written(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    reader = Reader.open(tmp_path / "c")
    assert reader.count == 10 and reader.batch_size == 4 and not reader.copy
    assert reader.arrays[0].shape == (10, 3, 4, 5)
    assert reader.arrays[1].tolist() == list(range(10))


def test_in_order_replay_is_zero_copy_and_writes_stay_private(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(8, 4))
    reader = Reader.open(tmp_path / "c")
    images, _ = next(replay(reader))
    assert isinstance(images, torch.Tensor)
    assert np.shares_memory(images.numpy(), reader.arrays[0])
    images.fill_(255)  # the consumer scribbles on its batch: copy-on-write, file unchanged
    assert np.load(tmp_path / "c" / "field0.npy")[:4].max() == 3
    again = Reader.open(tmp_path / "c")
    assert next(replay(again))[0].max().item() == 3


def test_truncated_file_is_refused_with_its_name(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    data = tmp_path / "c" / "field0.npy"
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size - 7)
    with pytest.raises(CacheInvalid, match=r"field0\.npy is truncated"):
        Reader.open(tmp_path / "c")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "field1.npy").unlink(), "field1.npy is missing"),
        (lambda p: _append(p / "field1.npy"), "longer than"),
        (lambda p: (p / "manifest.json").write_text("{"), "not valid JSON"),
        (lambda p: (p / "manifest.json").write_text('{"format": "x"}'), "not an asyncflow"),
        (lambda p: _edit(p, version=99), "format version 99"),
        (lambda p: _edit(p, layout="rows"), "garbles"),
        (lambda p: _edit(p, count=11), "truncated"),
        # damage in place: a byte changed, the sizes kept
        (lambda p: _replace(p / "manifest.json", b'"count": 10', b'"count": 11'),
         r"manifest\.json does not match its checksum \(damaged\)"),
        (lambda p: _replace(p / "manifest.json", b'"uint8"', b'"uint7"'), "does not match its"),
        (lambda p: _flip(p / "field0.crc32", 2),
         r"field0\.crc32 does not match its checksum in the manifest \(damaged\)"),
        (lambda p: _flip(p / "field1.npy", 40),
         r"field1\.npy: its \.npy header differs from the manifest's field item\[1\] at byte 40"),
        (lambda p: (p / "field1.crc32").unlink(), r"field1\.crc32 is missing"),
        (lambda p: _append(p / "field0.crc32"), r"field0\.crc32 holds 5 bytes, expected 4"),
        (lambda p: _folder_for(p / "field1.npy"), r"field1\.npy is a folder, not the cache's"),
        (lambda p: _folder_for(p / "field0.crc32"), r"field0\.crc32 is a folder, not the"),
    ],
)
def test_damaged_caches_are_refused(tmp_path: Path, damage: Any, message: str) -> None:
    write(tmp_path / "c", batches(10, 4))
    damage(tmp_path / "c")
    with pytest.raises(CacheInvalid, match=message):
        Reader.open(tmp_path / "c")


def test_the_manifest_is_signed_by_the_checksum_of_a_resume_state(tmp_path: Path) -> None:
    """Issue 24: one checksum of a plain-JSON record. A cache of format version 2 (its
    manifest signed by its own CRC-32, its listings identified otherwise) is refused by its
    version, saying so."""
    from asyncflow.pipeline import state_checksum

    write(tmp_path / "c", batches(10, 4))
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest.pop("check") == state_checksum(manifest) and manifest["version"] == 3
    older = dict(manifest, version=2, manifest_crc32=7)
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(older))
    with pytest.raises(CacheInvalid, match="it has format version 2, this asyncflow writes 3"):
        Reader.open(tmp_path / "c")


def _folder_for(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _append(path: Path) -> None:
    with path.open("ab") as fh:
        fh.write(b"x")


def _replace(file: Path, old: bytes, new: bytes) -> None:
    data = file.read_bytes()
    assert data.count(old) == 1
    file.write_bytes(data.replace(old, new))


def _flip(file: Path, offset: int) -> None:
    with open(file, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x01]))


def _edit(path: Path, **changes: Any) -> None:
    """Change the manifest as a writer would have written it (its checksum updated)."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    manifest["check"] = manifest_digest(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_missing_cache_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Reader.open(tmp_path / "nothing")


def test_an_empty_pass_is_an_empty_cache(tmp_path: Path) -> None:
    write(tmp_path / "c", [])
    reader = Reader.open(tmp_path / "c")
    assert reader.count == 0 and list(replay(reader)) == []


def test_remove_cache_refuses_what_is_not_a_cache(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "photo.jpg").write_bytes(b"x")
    with pytest.raises(ConfigError, match="not an asyncflow cache"):
        remove_cache(data)
    assert (data / "photo.jpg").exists()
    write(tmp_path / "c", batches(4, 4))
    remove_cache(tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_durable_commit(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "c", layout="samples", meta={})
    writer.write((np.arange(3), 1.5))
    writer.commit(durable=True)
    assert Reader.open(tmp_path / "c").count == 1


def test_write_accepts_non_contiguous_and_gpu_free_inputs(tmp_path: Path) -> None:
    base = torch.arange(2 * 3 * 4, dtype=torch.int32).view(2, 3, 4)
    write(tmp_path / "c", [(base.transpose(1, 2),)])
    reader = Reader.open(tmp_path / "c")
    assert torch.equal(next(replay(reader))[0], base.transpose(1, 2))


@pytest.mark.parametrize(("sizes", "replayed"), [
    ((3, 4, 4, 2), [4, 4, 4, 1]), ((4, 3, 4), [4, 4, 3]), ((0, 3, 3), [3, 3]),
])
@pytest.mark.parametrize("layout", ["batches", "lists"])
def test_batches_come_back_at_the_largest_upstream_size(
    tmp_path: Path, layout: str, sizes: tuple[int, ...], replayed: list[int]
) -> None:
    # A batch that lost failed rows (assemble under a failure budget, as image.folder with a
    # corrupt file) is short mid-stream. The first batch's size was taken for the replay's:
    # one failure in the first batch made every replayed batch short, an empty first batch
    # made the whole cache one batch.
    def item(size: int) -> Any:
        ids = torch.arange(size)
        return (ids,) if layout == "batches" else [(i,) for i in ids]

    write(tmp_path / "c", [item(size) for size in sizes], layout=layout)
    reader = Reader.open(tmp_path / "c")
    assert reader.batch_size == max(sizes)
    assert [len(b[0]) if layout == "batches" else len(b) for b in replay(reader)] == replayed


def test_a_failed_write_says_which_cache_and_leaves_nothing(tmp_path: Path) -> None:
    class Full:
        def write(self, data: object) -> int:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            pass

    writer = Writer(tmp_path / "c", layout="batches", meta={})
    writer.write(batches(4, 4)[0])
    writer._files[0].close()
    writer._files[0] = Full()
    with pytest.raises(OSError, match="No space") as err:
        writer.write(batches(4, 4)[0])
    assert any(str(tmp_path / "c") in note for note in err.value.__notes__)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


class _Advice:
    """Stands in for a field's mapping: records what ``madvise`` is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, int]] = []

    def madvise(self, option: int, start: int, length: int) -> None:
        self.asked.append((option, start, length))


@pytest.mark.parametrize("resident", [False, True])
def test_prefetch_asks_for_the_rows_of_a_cold_cache_only(
    tmp_path: Path, monkeypatch: Any, resident: bool
) -> None:
    big = torch.zeros((8, 3, 64, 64), dtype=torch.uint8)  # 12 KiB per sample: pages of its own
    write(tmp_path / "c", [(big, torch.arange(8))])
    mapped = Reader.open(tmp_path / "c")
    maps = (_Advice(), _Advice())
    reader = dataclasses.replace(mapped, maps=maps)  # type: ignore[arg-type]
    monkeypatch.setattr(_reader, "_resident", lambda page: resident)

    def span(start: int, stop: int, size: int = 3 * 64 * 64) -> tuple[int, int, int]:
        begin = HEADER_BYTES + start * size
        aligned = begin - begin % mmap.PAGESIZE
        return _reader._WILLNEED, aligned, HEADER_BYTES + stop * size - aligned

    reader.prefetch(range(2, 5))
    reader.prefetch(np.array([6, 1]))
    reader.prefetch(np.array([], dtype=np.int64))
    if resident:  # a warm cache: nothing asked
        assert maps[0].asked == [] and maps[1].asked == []
        return
    assert maps[0].asked == [span(2, 5), span(6, 7), span(1, 2)]
    # labels: one range asked; scattered rows of a field smaller than a page are left to
    # the kernel's read-around
    assert maps[1].asked == [span(2, 5, size=8)]
