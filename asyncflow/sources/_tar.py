"""Tar shards streamed from a local file, HTTP(S) or S3, grouped into WebDataset samples.

Nothing is written to disk: the archive is parsed block by block as its bytes arrive (gzip
shards are inflated on the way). A remote read that breaks mid-shard resumes with a range
request from the byte where it stopped, under the same :class:`Retry` policy as
``read_bytes``.

Members are checked before their bytes are used. Absolute names, ``..`` components, hard or
symbolic links, device files and FIFOs are refused with a :class:`SourceError`: an explicit
check, never an ``assert``, so it holds under ``python -O`` too.
"""

from __future__ import annotations

import asyncio
import os
import re
import tarfile
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

from .._errors import ConfigError, SourceError, SourceTimeout
from ._read import as_url, check_scheme
from ._redact import redact_url
from ._retry import Retry, Timeout, Transient, resolve_policy

__all__ = ["tar_members", "tar_samples"]

_BLOCK = tarfile.BLOCKSIZE
_REGULAR = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_LINKS = frozenset({tarfile.LNKTYPE, tarfile.SYMTYPE})
_DEVICES = frozenset({tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE})
_PAX = frozenset({tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE})
_DRIVE = re.compile(r"^[A-Za-z]:")
DEFAULT_MAX_MEMBER_BYTES = 1 << 31


def unsafe_reason(name: str) -> str | None:
    """Why a member called ``name`` may not be used, or ``None`` if it may."""
    if not name:
        return "empty name"
    if "\x00" in name:
        return "NUL in name"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "'..' component"
    return None


class _Reader:
    """Exact-size reads over an async stream of chunks."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self.position = 0

    async def _more(self) -> bool:
        try:
            self._buf += await anext(self._chunks)
        except StopAsyncIteration:
            return False
        return True

    async def read(self, n: int) -> bytes:
        """``n`` bytes, or fewer only at the end of the stream."""
        while len(self._buf) < n:
            if not await self._more():
                break
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self.position += len(data)
        return data

    async def skip(self, n: int) -> int:
        """Drop ``n`` bytes without keeping them; returns how many there were."""
        dropped = 0
        while dropped < n:
            if not self._buf and not await self._more():
                break
            take = min(n - dropped, len(self._buf))
            del self._buf[:take]
            dropped += take
        self.position += dropped
        return dropped


async def _gunzip_if_needed(
    chunks: AsyncIterator[bytes], what: object
) -> AsyncGenerator[bytes, None]:
    """The stream as is, or inflated when it starts with the gzip magic (multi-member too)."""
    first = b""
    async for chunk in chunks:
        first += chunk
        if len(first) >= 2:
            break
    if first[:2] != b"\x1f\x8b":
        if first:
            yield first
        async for chunk in chunks:
            yield chunk
        return
    inflater = zlib.decompressobj(wbits=31)
    fed = False  # whether the current gzip member has had any input yet
    pending = first
    while True:
        while pending:
            if not fed and not pending.strip(b"\x00"):
                pending = b""  # zero padding after the last member, as some writers leave
                break
            fed = True
            try:
                out = inflater.decompress(pending)
            except zlib.error as exc:
                raise SourceError(f"{what}: corrupt gzip data ({exc})") from None
            if out:
                yield out
            if inflater.eof:
                pending = inflater.unused_data
                inflater, fed = zlib.decompressobj(wbits=31), False
            else:
                pending = b""
        try:
            pending = await anext(chunks)
        except StopAsyncIteration:
            break
    if fed:
        raise SourceError(f"{what}: gzip stream ends early (truncated shard)")


async def _chunks(
    url: str,
    scheme: str,
    retry: Retry,
    timeout: Timeout,
    endpoint_url: str | None,
) -> AsyncGenerator[bytes, None]:
    """The shard's raw bytes; remote reads resume after a transient failure."""
    if scheme == "file":
        from ._files import file_path, stream_file

        async with aclosing(stream_file(file_path(url))) as local:
            async for chunk in local:
                yield chunk
        return
    what = f"GET {redact_url(url)}"
    loop = asyncio.get_running_loop()
    deadline = None if timeout.total is None else loop.time() + timeout.total
    offset = failures = 0
    async with _client(scheme, timeout, endpoint_url) as client:
        while True:
            try:
                async with aclosing(
                    _open(scheme, client, url, offset, what, retry, timeout)
                ) as stream:
                    async for chunk in stream:
                        offset += len(chunk)
                        failures = 0  # progress: the budget is per stall, not per shard
                        yield chunk
                        if deadline is not None and loop.time() > deadline:
                            raise SourceTimeout(
                                f"{what}: shard not read within total={timeout.total}s"
                            )
                return
            except Transient as exc:
                failure = exc
            failures += 1
            wait = retry.delay(failures, failure.retry_after)
            late = deadline is not None and loop.time() + wait > deadline
            if failures >= retry.attempts or late:
                error = SourceTimeout if failure.timeout or late else SourceError
                raise error(
                    f"{what}: {failure.reason} at byte {offset} (gave up after "
                    f"{failures} attempt{'s' if failures > 1 else ''} without progress"
                    f"{f', total={timeout.total}s' if late else ''})"
                )
            await asyncio.sleep(wait)


def _client(scheme: str, timeout: Timeout, endpoint_url: str | None) -> Any:
    if scheme == "s3":
        from ._s3 import s3_client

        return s3_client(endpoint_url, timeout)
    from ._http import http_session

    return http_session()


def _open(
    scheme: str,
    client: Any,
    url: str,
    offset: int,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> AsyncGenerator[bytes, None]:
    if scheme == "s3":
        from . import _s3

        return _s3.stream(client, url, offset, what=what, retry=retry)
    from . import _http

    return _http.stream(client, url, offset, what=what, retry=retry, timeout=timeout)


def _pax_records(data: bytes, what: object) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:pos + 1] == b"\x00":
            break
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise SourceError(f"{what}: corrupt pax header") from None
        if space < 0 or length <= 0 or pos + length > len(data):
            raise SourceError(f"{what}: corrupt pax header")
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


async def _iter_members(
    reader: _Reader, what: object, max_member_bytes: int
) -> AsyncGenerator[tuple[str, bytes], None]:
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        at = reader.position
        block = await reader.read(_BLOCK)
        if not block or block.count(0) == _BLOCK:
            return  # the end-of-archive marker (or a stream that simply ends between members)
        if len(block) < _BLOCK:
            raise SourceError(f"{what}: truncated tar header at byte {at}")
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise SourceError(f"{what}: not a tar archive, or a corrupt header at byte {at} "
                              f"({exc})") from None
        try:
            size = int(pax.get("size", info.size)) if info.type not in _PAX else info.size
        except ValueError:
            raise SourceError(f"{what}: corrupt pax size at byte {at}") from None
        if info.type in _PAX or info.type in (tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                                              tarfile.GNUTYPE_LONGLINK):
            if size > 1 << 20:
                raise SourceError(f"{what}: oversized tar extension header at byte {at}")
            data = await _read_member(reader, size, what, at)
            if info.type in _PAX:
                pax = _pax_records(data, what)
            elif info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data.rstrip(b"\x00").decode("utf-8", "surrogateescape")
            continue  # global headers and long link names matter to no member we keep
        name = pax.get("path") or long_name or info.name
        long_name, pax = None, {}
        if info.type in _LINKS:
            raise SourceError(f"{what}: tar member {name!r} is a link; refused")
        if info.type in _DEVICES:
            raise SourceError(f"{what}: tar member {name!r} is a device or FIFO; refused")
        reason = unsafe_reason(name)
        if reason is not None:
            raise SourceError(f"{what}: unsafe tar member {name!r} ({reason}); refused")
        if info.type == tarfile.DIRTYPE:
            await _skip_member(reader, size, what, at)
            continue
        if info.type not in _REGULAR:
            raise SourceError(
                f"{what}: tar member {name!r} has unsupported type {info.type!r}; refused"
            )
        if size > max_member_bytes:
            raise SourceError(
                f"{what}: tar member {name!r} is {size} bytes, over max_member_bytes="
                f"{max_member_bytes}"
            )
        yield name, await _read_member(reader, size, what, at)


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


async def _read_member(reader: _Reader, size: int, what: object, at: int) -> bytes:
    data = await reader.read(size)
    if len(data) < size or await reader.skip(_padded(size) - size) < _padded(size) - size:
        raise SourceError(f"{what}: tar member at byte {at} is truncated")
    return data


async def _skip_member(reader: _Reader, size: int, what: object, at: int) -> None:
    if await reader.skip(_padded(size)) < _padded(size):
        raise SourceError(f"{what}: tar member at byte {at} is truncated")


def _check_max(max_member_bytes: int) -> None:
    if isinstance(max_member_bytes, bool) or not isinstance(max_member_bytes, int):
        raise ConfigError(f"max_member_bytes must be an int, got {max_member_bytes!r}")
    if max_member_bytes < 0:
        raise ConfigError(f"max_member_bytes must be >= 0, got {max_member_bytes}")


def tar_members(
    url: str | os.PathLike[str],
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> AsyncGenerator[tuple[str, bytes], None]:
    """``(name, data)`` for each regular file in a tar shard, in archive order.

    Directories are skipped; links, devices, FIFOs and unsafe names are refused. Arguments
    as for :func:`tar_samples`.
    """
    text = as_url(url)
    scheme = check_scheme(text, schemes)
    _check_max(max_member_bytes)
    return _members(text, scheme, retry, timeout, endpoint_url, max_member_bytes)


async def _members(
    url: str,
    scheme: str,
    retry: Retry | None,
    timeout: Timeout | None,
    endpoint_url: str | None,
    max_member_bytes: int,
) -> AsyncGenerator[tuple[str, bytes], None]:
    policy, deadlines = resolve_policy(retry, timeout)
    what = redact_url(url)
    raw = _chunks(url, scheme, policy, deadlines, endpoint_url)
    async with aclosing(raw), aclosing(_gunzip_if_needed(raw, what)) as plain:
        reader = _Reader(plain)
        async with aclosing(_iter_members(reader, what, max_member_bytes)) as members:
            async for member in members:
                yield member


def split_member_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member, WebDataset style, or ``None`` for no extension.

    The key is the path up to the first dot of the file name: ``"a/b.seg.png"`` gives
    ``("a/b", "seg.png")``. Extensions are lower-cased.
    """
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def tar_samples(
    url: str | os.PathLike[str],
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> AsyncGenerator[dict[str, Any], None]:
    """The samples of a WebDataset tar shard: consecutive members grouped by key.

    ``train/0001.jpg`` and ``train/0001.cls`` become ``{"__key__": "train/0001",
    "__url__": url, "jpg": b"...", "cls": b"..."}``, where ``url`` has credentials and
    query values masked. Members without an extension are skipped. The shard streams from a
    path, ``file://``, ``http(s)://`` or ``s3://`` URL (``.tar`` or gzip-compressed) without
    touching the disk, so a list of shards feeds a pipeline directly::

        Pipeline(shard_urls).flat_map(sources.tar_samples)

    Args:
        url: Where the shard is.
        retry: Retry policy for opening and resuming the stream.
        timeout: Deadlines; ``read`` bounds each wait for more bytes, ``total`` the shard.
        schemes: The schemes that may be read; default: the pipeline's, else all.
        endpoint_url: An S3-compatible endpoint (default: the standard AWS configuration).
        max_member_bytes: Largest member accepted (a shard cannot make this read unbounded
            memory).

    Raises:
        SourcePermissionError: The scheme is not enabled (at once, by this call).
        SourceError: A corrupt or truncated shard, an unsafe member (absolute path, ``..``,
            link, device), or a key with the same extension twice; raised on iteration,
            after every complete sample before it.

    Cancellation:
        Cancelling the iterating task closes the stream. Close an iterator left early with
        ``contextlib.aclosing`` to release its connection at once.
    """
    members = tar_members(
        url, retry=retry, timeout=timeout, schemes=schemes, endpoint_url=endpoint_url,
        max_member_bytes=max_member_bytes,
    )
    return _group(members, redact_url(as_url(url)))


async def _group(
    members: AsyncGenerator[tuple[str, bytes], None], shown_url: str
) -> AsyncGenerator[dict[str, Any], None]:
    sample: dict[str, Any] | None = None
    async with aclosing(members):
        async for name, data in members:
            parts = split_member_name(name)
            if parts is None:
                continue
            key, ext = parts
            if sample is None or sample["__key__"] != key:
                if sample is not None:
                    yield sample
                sample = {"__key__": key, "__url__": shown_url}
            if ext in sample:
                raise SourceError(f"{shown_url}: tar member {name!r} repeats {ext!r} of {key!r}")
            sample[ext] = data
    if sample is not None:
        yield sample
