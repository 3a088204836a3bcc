"""read_bytes on local files and its dispatch by scheme; sources stay lazy to import."""

from __future__ import annotations

import os
import pathlib

import pytest

import asyncflow
from asyncflow import ConfigError, SourceError, SourceNotFound, SourcePermissionError, sources
from asyncflow.sources import ObjectInfo
from asyncflow.sources._transport import scheme_of
from tests.doubles import run_child

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")


@pytest.fixture
def blob(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "dir with space" / "a%b.bin"
    path.parent.mkdir()
    path.write_bytes(b"\x00\x01payload")
    return path


async def test_reads_paths_pathlikes_and_file_urls(blob: pathlib.Path) -> None:
    assert await asyncflow.read_bytes(str(blob)) == b"\x00\x01payload"
    assert await asyncflow.read_bytes(blob) == b"\x00\x01payload"
    assert await asyncflow.read_bytes(blob.as_uri()) == b"\x00\x01payload"
    assert await asyncflow.read_bytes(f"file://localhost{blob.as_uri()[7:]}") == b"\x00\x01payload"
    assert await asyncflow.read_bytes(ObjectInfo(str(blob), 9)) == b"\x00\x01payload"


async def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SourceNotFound, match=r"missing\.jpg") as info:
        await asyncflow.read_bytes(tmp_path / "missing.jpg")
    assert isinstance(info.value, FileNotFoundError)


async def test_a_missing_file_streamed_fails_as_one_read_whole(tmp_path: pathlib.Path) -> None:
    # One translation of OS errors (``_blob.os_error``) for whole reads and streams alike.
    missing = tmp_path / "missing.tar"
    with pytest.raises(SourceNotFound) as whole:
        await asyncflow.read_bytes(missing)
    with pytest.raises(SourceNotFound) as streamed:
        await anext(sources.tar_members(missing))
    assert str(streamed.value) == str(whole.value) == f"{missing}: no such file"


async def test_a_directory_is_not_a_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SourceError, match=str(tmp_path)):
        await asyncflow.read_bytes(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
async def test_unreadable_file(blob: pathlib.Path) -> None:
    blob.chmod(0)
    with pytest.raises(SourcePermissionError):
        await asyncflow.read_bytes(blob)


async def test_file_urls_on_other_hosts_are_refused() -> None:
    with pytest.raises(SourceError, match="another host"):
        await asyncflow.read_bytes("file://server/share/a.jpg")


async def test_file_scheme_can_be_disabled(blob: pathlib.Path) -> None:
    with pytest.raises(SourcePermissionError, match="'file' is not enabled"):
        await asyncflow.read_bytes(blob, schemes={"https"})
    with pytest.raises(SourcePermissionError):
        await asyncflow.read_bytes(blob.as_uri(), schemes={"s3"})


async def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        await asyncflow.read_bytes(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await asyncflow.read_bytes("x", retry=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("/a/b", "file"), ("a/b.jpg", "file"), ("file:///a", "file"), ("FILE:/a", "file"),
     ("HTTPS://h/x", "https"), ("s3://b/k", "s3"), ("ftp://h/x", "ftp"), ("c:/x", "file"),
     ("weird:name.jpg", "file"), ("httpx", "file"), ("s3x", "file"), ("http://h/x", "http"),
     ("dir/http://x", "file")],
)
def test_scheme_of(url: str, scheme: str) -> None:
    assert scheme_of(url) == scheme


def test_object_info_repr_hides_secrets() -> None:
    info = ObjectInfo("https://h/a.jpg?X-Amz-Signature=s3cr3t", 10, "e")
    assert "s3cr3t" not in repr(info)


def test_public_names() -> None:
    for name in sources.__all__:
        assert getattr(sources, name) is not None
        assert not name.startswith("_")
    assert sources.__all__ == sorted(sources.__all__)
    for name in ("read_bytes", "list_objects", "tar_samples", "tar_members", "session",
                 "ObjectInfo", "Retry", "Timeout"):
        assert name in sources.__all__
    assert asyncflow.read_bytes is sources.read_bytes
    assert asyncflow.Retry is sources.Retry


def test_importing_sources_loads_no_network_library() -> None:
    result = run_child(
        """
        import sys
        import asyncflow, asyncflow.sources
        from asyncflow import sources
        sources.Retry, sources.Timeout, sources.read_bytes, sources.list_objects
        sources.tar_samples
        loaded = [m for m in ("aiohttp", "aiobotocore", "botocore", "aiofiles", "torch")
                  if m in sys.modules]
        print("loaded:", loaded)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout


# -- issue 25.6: regular files only, at most max_bytes; 25.11: the bytes name their URL --


async def test_only_regular_files_are_read(tmp_path: pathlib.Path) -> None:
    (tmp_path / "zero").symlink_to("/dev/zero")  # read whole, it would never end
    with pytest.raises(SourceError, match="zero: is a character device, not a regular file"):
        await asyncflow.read_bytes(tmp_path / "zero")
    os.mkfifo(tmp_path / "pipe")  # a plain open() blocks until a writer comes
    with pytest.raises(SourceError, match="pipe: is a FIFO"):
        await asyncflow.read_bytes((tmp_path / "pipe").as_uri())


async def test_max_bytes_refuses_a_larger_local_file(blob: pathlib.Path) -> None:
    assert await asyncflow.read_bytes(blob, max_bytes=9) == b"\x00\x01payload"
    with pytest.raises(SourceError, match=r"a%b\.bin: 9 bytes, over max_bytes=8"):
        await asyncflow.read_bytes(blob, max_bytes=8)
    with pytest.raises(SourceError, match=r"12 bytes \(listed\), over max_bytes=9"):
        await asyncflow.read_bytes(ObjectInfo(str(blob), 12), max_bytes=9)
    with pytest.raises(ConfigError, match="max_bytes"):
        await asyncflow.read_bytes(blob, max_bytes=-1)


async def test_the_bytes_name_the_object_they_came_from(blob: pathlib.Path) -> None:
    data = await asyncflow.read_bytes(blob.as_uri())
    assert data == b"\x00\x01payload"
    assert data.url == blob.as_uri()
    assert "a%25b.bin" in repr(data) and "payload" not in repr(data)
