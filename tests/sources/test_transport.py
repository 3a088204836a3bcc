"""The one dispatch point: every reader gets its transport for a URL's scheme from one place."""

from __future__ import annotations

import io
import pathlib
import tarfile
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest

import asyncflow
from asyncflow import Retry, SourceError, SourcePermissionError, Timeout, sources
from asyncflow.sources import _transport
from asyncflow.sources._files import FileTransport
from asyncflow.sources._transport import ObjectInfo, transport_for

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Recording:
    """A transport that serves fixed bytes and records each call, with the policies given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Retry, Timeout]] = []

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        self.calls.append(("fetch", url, retry, timeout))
        return b"fetched"

    async def stream(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[bytes, None]:
        self.calls.append(("stream", url, retry, timeout))
        yield _tar("k.txt", b"streamed")

    async def list(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[ObjectInfo, None]:
        self.calls.append(("list", url, retry, timeout))
        yield ObjectInfo(f"{url}/listed", 6)


@pytest.mark.parametrize(
    ("url", "kind"),
    [("/data/a.jpg", "FileTransport"), ("relative/a.jpg", "FileTransport"),
     ("file:///data/a.jpg", "FileTransport"), ("http://h/a", "HttpTransport"),
     ("HTTPS://h/a", "HttpTransport"), ("s3://b/k", "S3Transport")],
)
def test_each_scheme_has_one_transport(url: str, kind: str) -> None:
    assert type(transport_for(url)).__name__ == kind


def test_a_scheme_resolves_to_one_transport_for_every_url() -> None:
    assert transport_for("/a") is transport_for("file:///b") is transport_for("c.tar")
    assert transport_for("http://h/a") is transport_for("https://g/b")
    assert transport_for("s3://b/k") is transport_for("s3://c/j")


def test_the_s3_transport_takes_its_endpoint() -> None:
    transport: Any = transport_for("s3://b/k", endpoint_url="http://127.0.0.1:9")
    assert transport.endpoint_url == "http://127.0.0.1:9"
    assert transport is not transport_for("s3://b/k")


async def test_every_reader_goes_through_the_one_dispatch_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    fake = Recording()
    endpoints: list[str | None] = []

    def make(endpoint_url: str | None) -> Recording:
        endpoints.append(endpoint_url)
        return fake

    monkeypatch.setitem(_transport.TRANSPORTS, "s3", make)
    url = "s3://bucket/shard.tar"
    retry, timeout = Retry(attempts=2), Timeout(read=5)
    options: dict[str, Any] = {"retry": retry, "timeout": timeout, "endpoint_url": "http://e"}
    assert await asyncflow.read_bytes(url, **options) == b"fetched"
    assert [x async for x in sources.tar_members(url, **options)] == [("k.txt", b"streamed")]
    assert [x async for x in sources.list_objects(url, **options)] == [f"{url}/listed"]
    assert fake.calls == [("fetch", url, retry, timeout), ("stream", url, retry, timeout),
                          ("list", url, retry, timeout)]
    assert endpoints == ["http://e"] * 3


async def test_readers_pass_the_pipelines_policies_to_the_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = Recording()
    monkeypatch.setitem(_transport.TRANSPORTS, "http", lambda endpoint_url: fake)
    retry, timeout = Retry(attempts=7), Timeout(total=9)
    async with sources.session(retry=retry, timeout=timeout):
        await asyncflow.read_bytes("http://h/a")
        # Made before the policies are known, read where they are: resolved on iteration.
    listing = sources.list_objects("http://h/list")
    async with sources.session(retry=retry, timeout=timeout):
        assert [x async for x in listing] == ["http://h/list/listed"]
    assert [call[2:] for call in fake.calls] == [(retry, timeout)] * 2


READERS: dict[str, Callable[..., object]] = {
    "read_bytes": asyncflow.read_bytes,
    "list_objects": sources.list_objects,
    "tar_samples": sources.tar_samples,
    "tar_members": sources.tar_members,
}


async def _refusal(reader: Callable[..., object], url: str, **kwargs: Any) -> Exception:
    """What ``reader`` raises for ``url``, at the call (awaiting it for ``read_bytes``)."""
    try:
        result = reader(url, **kwargs)
        if isinstance(result, Awaitable):
            await result
    except Exception as exc:  # the test compares what each reader raises
        return exc
    raise AssertionError(f"{reader} accepted {url}")


@pytest.mark.parametrize(
    ("url", "schemes"),
    [("/data/a.tar", {"s3"}), ("file:///data/a.tar", {"http", "https"}),
     ("http://user:pw@h/a.tar?sig=secret", {"https"}), ("s3://b/a.tar", {"file"})],
)
async def test_a_disabled_scheme_is_refused_the_same_way_by_every_reader(
    url: str, schemes: set[str]
) -> None:
    errors = [await _refusal(reader, url, schemes=schemes) for reader in READERS.values()]
    assert all(type(e) is SourcePermissionError for e in errors)
    assert len({str(e) for e in errors}) == 1
    assert "is not enabled" in str(errors[0])
    assert "secret" not in str(errors[0]) and "pw" not in str(errors[0])


async def test_an_unsupported_scheme_is_refused_the_same_way_by_every_reader() -> None:
    errors = [await _refusal(reader, "ftp://h/a.tar") for reader in READERS.values()]
    assert all(type(e) is SourceError for e in errors)
    assert {str(e) for e in errors} == {"ftp://h/a.tar: unsupported scheme 'ftp'"}


async def test_the_pipelines_schemes_apply_to_every_reader(tmp_path: pathlib.Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(_tar("k.txt", b"local"))
    async with sources.session(schemes={"https"}):
        errors = [await _refusal(reader, str(shard)) for reader in READERS.values()]
    assert all(type(e) is SourcePermissionError for e in errors)
    assert await FileTransport().fetch(str(shard), retry=Retry(), timeout=Timeout()) == \
        shard.read_bytes()
