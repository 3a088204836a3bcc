"""``list_objects``: every object under an S3 prefix, a local folder, or a manifest of URLs.

Each listing yields URLs (``str``) that ``read_bytes`` takes as they are, so a listing is a
ready pipeline source::

    Pipeline(sources.list_objects("s3://bucket/train/")).map(asyncflow.read_bytes, ...)

With ``split=Split()`` each rank (and DataLoader worker) lists everything and keeps its share.

Each scheme's transport does the listing (see ``_transport``); manifests are parsed by
``_manifest``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any, Literal, overload

from .._errors import ConfigTypeError, SourceNotFound
from .._redact import redact_url
from ..ranks import Split
from ._retry import Retry, Timeout, resolve_policy
from ._transport import ObjectInfo, Transport, as_url, transport_for

__all__ = ["list_objects"]


@overload
def list_objects(
    prefix_url: str | os.PathLike[str],
    *,
    detail: Literal[False] = ...,
    retry: Retry | None = ...,
    timeout: Timeout | None = ...,
    schemes: Iterable[str] | None = ...,
    endpoint_url: str | None = ...,
    split: Split | None = ...,
    allow_empty: bool = ...,
) -> AsyncIterator[str]: ...


@overload
def list_objects(
    prefix_url: str | os.PathLike[str],
    *,
    detail: Literal[True],
    retry: Retry | None = ...,
    timeout: Timeout | None = ...,
    schemes: Iterable[str] | None = ...,
    endpoint_url: str | None = ...,
    split: Split | None = ...,
    allow_empty: bool = ...,
) -> AsyncIterator[ObjectInfo]: ...


def list_objects(
    prefix_url: str | os.PathLike[str],
    *,
    detail: bool = False,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
    split: Split | None = None,
    allow_empty: bool = False,
) -> AsyncIterator[str] | AsyncIterator[ObjectInfo]:
    """Every object under ``prefix_url``, as an async iterator of URLs.

    - ``s3://bucket/prefix``: every key starting with ``prefix`` (folder markers, keys
      ending in ``/``, skipped), page after page, in the store's (lexicographic) order.
      Yields ``"s3://bucket/key"``.
    - A local folder (a path or ``file://`` URL): every file below it, recursively, sorted.
      A path that is no folder lists the files of its parent folder whose path starts with
      it, like an S3 prefix. Yields paths (or ``file://`` URLs, when given one).
    - A manifest of URLs: an ``http(s)://`` URL, or a local file named ``*.txt``, ``*.lst``,
      ``*.list`` or ``*.manifest``, with one URL or path per line (blank lines and lines
      starting with ``#`` skipped; relative ones resolved against the manifest's own URL).
      A remote manifest may not name local files. An ``http(s)://`` URL is always read as
      such a manifest: a server's HTML directory page, a JSON document or any line that is
      not a URL is refused, never turned into URLs.

    Args:
        prefix_url: Where to list.
        detail: Yield :class:`ObjectInfo` records (url, size, etag) instead of URLs.
        retry: Retry policy of each page request; default: the pipeline's, else ``Retry()``.
        timeout: Deadlines of each page request; default: the pipeline's, else ``Timeout()``.
        schemes: The schemes that may be read; default: the pipeline's, else all.
        endpoint_url: An S3-compatible endpoint (default: the standard AWS configuration).
        split: Yield only this process's share of the listing (see :class:`Split`): the
            whole listing is read first (every rank lists the same objects, in the same
            order), then its part is yielded, with the same count on every rank.
        allow_empty: Let a listing that finds nothing end quietly. By default it is an
            error: a typo in a prefix would otherwise give epochs of no batches.

    Raises:
        ConfigTypeError: ``split`` is not a :class:`Split`.
        SourcePermissionError: The scheme is not enabled (raised at once, by this call).
        SourceNotFound: The bucket, folder or manifest does not exist, or nothing is listed
            under ``prefix_url`` (unless ``allow_empty``); raised on iteration.
        SourceError: A remote manifest is not a list of URLs (an HTML page, say); the
            message names the URL, the line and the format accepted (raised on iteration).

    Cancellation:
        Cancelling the iterating task cancels the page request in progress. Close an
        iterator left early with ``contextlib.aclosing`` to release its client at once.
    """
    url = as_url(prefix_url)
    if split is not None and not isinstance(split, Split):
        raise ConfigTypeError(f"split must be an asyncflow.Split, got {split!r:.80}")
    transport = transport_for(url, schemes, endpoint_url)
    listing = _listing(transport, url, detail, retry, timeout, allow_empty)
    return listing if split is None else split(listing)


async def _listing(
    transport: Transport,
    url: str,
    detail: bool,
    retry: Retry | None,
    timeout: Timeout | None,
    allow_empty: bool,
) -> AsyncIterator[Any]:
    # Policies are resolved on iteration: a listing made before a run is read inside it.
    policy, deadlines = resolve_policy(retry, timeout)
    empty = True
    async with aclosing(transport.list(url, retry=policy, timeout=deadlines)) as found:
        async for info in found:
            empty = False
            yield info if detail else info.url
    if empty and not allow_empty:
        raise SourceNotFound(
            f"{redact_url(url)}: nothing is listed there (a typo in the prefix? prefixes "
            "match keys and paths exactly, case included); pass allow_empty=True to accept "
            "an empty listing"
        )
