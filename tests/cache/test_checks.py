"""Block checksums: written with the cache, checked as a replay first reads each block."""

from __future__ import annotations

import types
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncflow import SourceError
from asyncflow.cache import _checks
from asyncflow.cache._checks import BlockSums, Checks
from asyncflow.cache._format import BLOCK_BYTES, HEADER_BYTES, block_rows
from asyncflow.cache._reader import Reader
from asyncflow.cache._replay import permutation, replay

from .test_reader import write

IMAGE_BYTES = 3 * 40 * 40  # above BLOCK_BYTES: a block per image


def batches(count: int, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of ``size`` images (uint8, image i filled with i) and their int64 labels."""
    out = []
    for start in range(0, count, size):
        ids = np.arange(start, min(start + size, count))
        out.append((np.repeat(ids.astype(np.uint8), IMAGE_BYTES).reshape(-1, 3, 40, 40), ids))
    return out


def flip(file: Path, offset: int) -> None:
    """Flip every bit of the byte at ``offset``: the file keeps its size."""
    with open(file, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_block_rows() -> None:
    assert block_rows(150528) == 1 and block_rows(BLOCK_BYTES) == 1
    assert block_rows(8) == BLOCK_BYTES // 8 and block_rows(3000) == 1
    assert block_rows(0) == 0


@pytest.mark.parametrize("pieces", [[10], [3, 7], [1] * 10])
def test_block_sums_do_not_depend_on_how_the_rows_arrive(pieces: list[int]) -> None:
    rows = np.random.default_rng(0).integers(0, 255, (10, 1500), dtype=np.uint8)
    sums, start = BlockSums(1500), 0  # two rows a block: the last block is short
    for n in pieces:
        sums.update(rows[start:start + n].reshape(-1))
        start += n
    table = np.frombuffer(sums.table(), "<u4").tolist()
    flat = rows.reshape(-1)
    assert table == [zlib.crc32(flat[i:i + 3000].data) for i in range(0, flat.size, 3000)]


def test_each_field_has_a_table_of_its_blocks(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    reader = Reader.open(tmp_path / "c")
    assert reader.block_rows == (1, BLOCK_BYTES // 8)
    assert [len(s) for s in reader.sums] == [10, 1]


@pytest.mark.parametrize("order", [None, "shuffled"])
def test_a_flipped_data_byte_is_an_error_naming_the_cache_file_rows_and_bytes(
    tmp_path: Path, order: str | None
) -> None:
    write(tmp_path / "c", batches(10, 4))
    flip(tmp_path / "c" / "field0.npy", HEADER_BYTES + 5 * IMAGE_BYTES + 7)  # row 5
    reader = Reader.open(tmp_path / "c")  # sizes, headers and tables are intact
    rows = None if order is None else permutation(10, 3)
    with pytest.raises(SourceError) as err:
        list(replay(reader, rows))
    start = HEADER_BYTES + 5 * IMAGE_BYTES
    assert str(err.value) == (
        f"cache {tmp_path / 'c'}: field0.npy (field item[0]) is damaged: row 5, bytes "
        f"{start}-{start + IMAGE_BYTES - 1} of the file, do not match their checksum; its "
        "next epoch rebuilds it")


def test_a_flipped_label_byte_names_the_rows_of_its_block(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    flip(tmp_path / "c" / "field1.npy", HEADER_BYTES + 8 * 3)
    with pytest.raises(SourceError, match=r"field1\.npy \(field item\[1\]\) is damaged: "
                                          rf"rows 0-9, bytes {HEADER_BYTES}-{HEADER_BYTES + 79} "):
        list(replay(Reader.open(tmp_path / "c")))


def test_nothing_of_a_damaged_batch_is_handed_out(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(12, 4))
    flip(tmp_path / "c" / "field0.npy", HEADER_BYTES + 9 * IMAGE_BYTES)  # the third batch
    got: list[Any] = []
    with pytest.raises(SourceError, match="row 9"):
        for batch in replay(Reader.open(tmp_path / "c")):
            got.append(batch[1].tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_samples_and_lists_are_checked_too(tmp_path: Path) -> None:
    items = [(np.full(5000, i, np.uint8), i) for i in range(6)]
    write(tmp_path / "s", items, layout="samples")
    flip(tmp_path / "s" / "field0.npy", HEADER_BYTES + 4 * 5000 + 1)
    with pytest.raises(SourceError, match="row 4"):
        list(replay(Reader.open(tmp_path / "s")))
    write(tmp_path / "l", [items[:3], items[3:]], layout="lists")
    flip(tmp_path / "l" / "field0.npy", HEADER_BYTES + 2 * 5000)
    with pytest.raises(SourceError, match="row 2"):
        list(replay(Reader.open(tmp_path / "l"), permutation(6, 1)))


class CountingZlib:
    def __init__(self) -> None:
        self.bytes = 0

    def crc32(self, data: Any, value: int = 0) -> int:
        self.bytes += memoryview(data).nbytes
        return zlib.crc32(data, value)


def test_blocks_are_checked_once_while_the_files_stay_the_same(
    tmp_path: Path, monkeypatch: Any
) -> None:
    write(tmp_path / "c", batches(64, 8))
    counting = CountingZlib()
    monkeypatch.setattr(_checks, "zlib", types.SimpleNamespace(crc32=counting.crc32))
    checks = Checks()
    list(replay(Reader.open(tmp_path / "c"), permutation(64, 0), checks=checks))
    assert counting.bytes == 64 * IMAGE_BYTES + 64 * 8  # every block, once
    list(replay(Reader.open(tmp_path / "c"), permutation(64, 1), checks=checks))
    list(replay(Reader.open(tmp_path / "c"), checks=checks))
    assert counting.bytes == 64 * IMAGE_BYTES + 64 * 8
    write(tmp_path / "c", batches(64, 8))  # rebuilt: new files, checked afresh
    counting.bytes = 0  # (the writer's checksums count too)
    list(replay(Reader.open(tmp_path / "c"), checks=checks))
    assert counting.bytes == 64 * IMAGE_BYTES + 64 * 8


def test_a_shuffled_epoch_checks_exactly_the_blocks_it_reads(
    tmp_path: Path, monkeypatch: Any
) -> None:
    write(tmp_path / "c", batches(64, 8))
    counting = CountingZlib()
    monkeypatch.setattr(_checks, "zlib", types.SimpleNamespace(crc32=counting.crc32))
    order = permutation(64, 0)
    first = next(replay(Reader.open(tmp_path / "c"), order))
    assert sorted(first[1].tolist()) == sorted(order[:8].tolist())
    assert counting.bytes == 8 * IMAGE_BYTES + 64 * 8  # its 8 images and the label block
