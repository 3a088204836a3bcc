"""Tar shards streamed from a local file, HTTP(S) or S3, grouped into WebDataset samples.

Nothing is written to disk: the archive is decoded as its bytes arrive (gzip shards are
inflated on the way). The bytes come from the scheme's transport (``Transport.stream``): a
remote read that breaks mid-shard resumes with a range request from the byte where it
stopped, under the same :class:`Retry` policy and retry loop as ``read_bytes``.

The event loop only moves bytes: inflating and parsing (``_tarstream.ShardDecoder``) run in
the loop's default thread pool, one short call per chunk, so a shard never stalls the loop
and no pool thread ever waits for the loop.

Members are checked before their bytes are used (see ``_tarstream``): absolute names, ``..``
components, links, devices, FIFOs and sparse files are refused with a :class:`SourceError`
(an explicit check, never an ``assert``, so it holds under ``python -O``); every size is
validated; a shard must end with its end-of-archive marker, and an empty one is an error.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from typing import Any

from .._errors import SourceError, check_int
from .._redact import redact_url
from ..pipeline import run_thread
from ._retry import Retry, Timeout, resolve_policy
from ._tarstream import Event, ShardDecoder
from ._tarstream import unsafe_reason as unsafe_reason
from ._transport import Transport, as_url, transport_for

__all__ = ["tar_members", "tar_samples"]

DEFAULT_MAX_MEMBER_BYTES = 1 << 31


def _events(
    url: str | os.PathLike[str],
    retry: Retry | None,
    timeout: Timeout | None,
    schemes: Iterable[str] | None,
    endpoint_url: str | None,
    max_member_bytes: int,
) -> AsyncGenerator[Event, None]:
    """Check the arguments now; the shard's events (see ``_tarstream.Event``) on iteration."""
    text = as_url(url)
    transport = transport_for(text, schemes, endpoint_url)
    check_int("max_member_bytes", max_member_bytes, 0)
    return _decode(transport, text, retry, timeout, max_member_bytes)


async def _decode(
    transport: Transport,
    url: str,
    retry: Retry | None,
    timeout: Timeout | None,
    max_member_bytes: int,
) -> AsyncGenerator[Event, None]:
    # Policies are resolved on iteration: a shard named before a run is read inside it.
    policy, deadlines = resolve_policy(retry, timeout)
    decoder = ShardDecoder(redact_url(url), max_member_bytes)
    async with aclosing(transport.stream(url, retry=policy, timeout=deadlines)) as raw:
        finished = False
        while not finished:
            # A plain tar ends at its end-of-archive marker; the record padding after it is
            # not worth another request.
            chunk = None if decoder.complete else await anext(raw, None)
            if chunk is None:
                decoder.finish()
                finished = True
            else:
                decoder.push(chunk)
            more = True
            while more:
                # Cancellation leaves the pump to finish on its thread; the decoder is dropped.
                events, more = await run_thread(decoder.pump)
                for event in events:
                    yield event
                if decoder.error is not None:
                    raise decoder.error


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

    Directories are skipped; links, devices, FIFOs, sparse files and unsafe names are
    refused. Arguments, errors and cancellation as for :func:`tar_samples`; on an error,
    every member complete before the damage has been yielded.
    """
    events = _events(url, retry, timeout, schemes, endpoint_url, max_member_bytes)
    return _files(events)


async def _files(events: AsyncGenerator[Event, None]) -> AsyncGenerator[tuple[str, bytes], None]:
    async with aclosing(events):
        async for name, data in events:
            if data is not None:
                yield name, data


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
        SourceError: A corrupt, truncated or empty shard (one that ends anywhere but at its
            end-of-archive marker, a size that is negative, too large or inconsistent, a bad
            pax record), an unsafe member (absolute path, ``..``, link, device, sparse
            file), or a key with the same extension twice. Raised on iteration, naming the
            shard and the byte offset, after every sample that was complete before the
            damage: a sample counts as complete once a member with another key has begun,
            so the last sample of a shard cut short is never yielded.

    Cancellation:
        Cancelling the iterating task closes the stream; a decoding step already running in
        the thread pool finishes there and its result is dropped. Close an iterator left
        early with ``contextlib.aclosing`` to release its connection at once.
    """
    events = _events(url, retry, timeout, schemes, endpoint_url, max_member_bytes)
    return _group(events, redact_url(as_url(url)))


async def _group(
    events: AsyncGenerator[Event, None], shown_url: str
) -> AsyncGenerator[dict[str, Any], None]:
    sample: dict[str, Any] | None = None
    async with aclosing(events):
        async for name, data in events:
            parts = split_member_name(name)
            if parts is None:
                continue
            key, ext = parts
            if sample is not None and sample["__key__"] != key:
                yield sample  # a member with another key has begun: this sample is whole
                sample = None
            if data is None:
                continue
            if sample is None:
                sample = {"__key__": key, "__url__": shown_url}
            if ext in sample:
                raise SourceError(f"{shown_url}: tar member {name!r} repeats {ext!r} of {key!r}")
            sample[ext] = data
    if sample is not None:
        yield sample
