"""asyncflow._blob: the one reader of whole local files (regular files only, at most
``max_bytes``, never blocking on open), and bytes that name where they came from."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest

from asyncflow import SourceError, SourceNotFound
from asyncflow._blob import Blob, describe_size, read_regular

pytestmark = pytest.mark.usefixtures("leak_check")


def _in_thread(fn: object, *args: object) -> BaseException | object:
    """``fn(*args)`` on a daemon thread, given 30 s (a hang fails the test, not the run)."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(fn(*args))  # type: ignore[operator]
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30.0)
    assert box, "the read blocked"
    return box[0]


def test_reads_a_regular_file_and_a_link_to_one(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 5000)
    (tmp_path / "link.bin").symlink_to(tmp_path / "a.bin")
    assert read_regular(tmp_path / "a.bin", "a", None) == b"x" * 5000
    assert read_regular(tmp_path / "link.bin", "a", 5000) == b"x" * 5000
    (tmp_path / "empty").write_bytes(b"")
    assert read_regular(tmp_path / "empty", "e", 0) == b""


def test_a_link_to_dev_zero_is_refused_before_any_byte_is_read(tmp_path: Path) -> None:
    (tmp_path / "odd.jpg").symlink_to("/dev/zero")
    got = _in_thread(read_regular, tmp_path / "odd.jpg", "odd.jpg", None)
    assert isinstance(got, SourceError)
    assert "odd.jpg: is a character device, not a regular file" in str(got)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jpg")
    got = _in_thread(read_regular, tmp_path / "pipe.jpg", "pipe.jpg", 100)
    assert isinstance(got, SourceError) and "pipe.jpg: is a FIFO" in str(got)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="is a directory, not a regular file"):
        read_regular(tmp_path, "d", None)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound, match="gone: no such file"):
        read_regular(tmp_path / "gone", "gone", None)


def test_a_file_over_max_bytes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"y" * 3000)
    assert read_regular(tmp_path / "big", "big", 3000) == b"y" * 3000
    with pytest.raises(SourceError, match=r"big: 2\.9 KiB \(3,000 bytes\), over max_bytes=2,999"):
        read_regular(tmp_path / "big", "big", 2999)


def test_a_file_reporting_size_zero_is_read_to_its_end_within_the_cap() -> None:
    # /proc files report st_size 0 yet hold bytes: the read goes on to the end, capped
    assert read_regular("/proc/self/status", "status", None).startswith(b"Name:")
    with pytest.raises(SourceError, match="over max_bytes=10"):
        read_regular("/proc/self/status", "status", 10)


def test_blob_is_bytes_that_name_their_url() -> None:
    blob = Blob(b"\xff\xd8payload", "https://user:pw@host/a.jpg?X-Amz-Signature=abc")
    assert blob == b"\xff\xd8payload" and isinstance(blob, bytes)
    assert repr(blob) == "<Blob of 9 bytes from 'https://***@host/a.jpg?X-Amz-Signature=***'>"
    assert type(blob[1:]) is bytes
    again = pickle.loads(pickle.dumps(blob))
    assert type(again) is Blob and again == blob and again.url == blob.url


def test_describe_size() -> None:
    assert describe_size(10) == "10 bytes"
    assert describe_size(3 << 20) == "3.0 MiB (3,145,728 bytes)"
