"""``list_objects``: every object under an S3 prefix, a local folder, or a manifest of URLs.

Each listing yields URLs (``str``) that ``read_bytes`` takes as they are, so a listing is a
ready pipeline source::

    Pipeline(sources.list_objects("s3://bucket/train/")).map(asyncflow.read_bytes, ...)
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Literal, overload
from urllib.parse import urljoin

from .._errors import SourceError, SourceNotFound, SourcePermissionError
from ._read import ObjectInfo, as_url, check_scheme, scheme_of
from ._redact import redact_url
from ._retry import Retry, Timeout, resolve_policy, with_retries

__all__ = ["MANIFEST_FORMAT", "MANIFEST_SUFFIXES", "list_objects"]

MANIFEST_SUFFIXES = frozenset({".txt", ".lst", ".list", ".manifest"})
MANIFEST_FORMAT = (
    "a manifest: UTF-8 plain text with one URL per line (relative ones resolved against the "
    "manifest's URL; blank lines and lines starting with '#' skipped)"
)
# Characters that RFC 3986 never allows in a URL, so a line holding one is not a URL.
_NOT_IN_A_URL = re.compile(r'[\s<>"{}|\\^`\x00-\x1f\x7f]')


@overload
def list_objects(
    prefix_url: str | os.PathLike[str],
    *,
    detail: Literal[False] = ...,
    retry: Retry | None = ...,
    timeout: Timeout | None = ...,
    schemes: Iterable[str] | None = ...,
    endpoint_url: str | None = ...,
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
) -> AsyncIterator[ObjectInfo]: ...


def list_objects(
    prefix_url: str | os.PathLike[str],
    *,
    detail: bool = False,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
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

    Raises:
        SourcePermissionError: The scheme is not enabled (raised at once, by this call).
        SourceNotFound: The bucket, folder or manifest does not exist (raised on iteration).
        SourceError: A remote manifest is not a list of URLs (an HTML page, say); the
            message names the URL, the line and the format accepted (raised on iteration).

    Cancellation:
        Cancelling the iterating task cancels the page request in progress. Close an
        iterator left early with ``contextlib.aclosing`` to release its client at once.
    """
    url = as_url(prefix_url)
    scheme = check_scheme(url, schemes)
    if scheme == "s3":
        return _list_s3(url, detail, retry, timeout, endpoint_url)
    if scheme in ("http", "https"):
        return _list_manifest_http(url, detail, retry, timeout)
    return _list_local(url, detail)


async def _list_s3(
    url: str,
    detail: bool,
    retry: Retry | None,
    timeout: Timeout | None,
    endpoint_url: str | None,
) -> AsyncIterator[Any]:
    from . import _s3

    policy, deadlines = resolve_policy(retry, timeout)
    bucket, prefix = _s3.split_s3_url(url)
    what = f"LIST {redact_url(url)}"
    token: str | None = None
    async with _s3.s3_client(endpoint_url, deadlines) as client:

        async def page() -> tuple[list[dict[str, Any]], str | None]:
            return await _s3.list_page(client, bucket, prefix, token, what=what, retry=policy)

        while True:
            objects, token = await with_retries(
                page, what=what, retry=policy, timeout=deadlines
            )
            for obj in objects:
                key = obj["Key"]
                if key.endswith("/"):
                    continue
                object_url = f"s3://{bucket}/{key}"
                if detail:
                    etag = obj.get("ETag")
                    yield ObjectInfo(object_url, obj.get("Size"), etag.strip('"') if etag else None)
                else:
                    yield object_url
            if token is None:
                return


def _walk(root: str) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                size = os.stat(path).st_size
            except OSError:
                continue  # vanished or a dangling link: not an object
            found.append((path, size))
    found.sort()  # whole paths in order, as an S3 listing orders keys
    return found


def _local_listing(path: str) -> tuple[str, list[tuple[str, int]] | None]:
    """``("folder", files)``, ``("manifest", None)`` or ``("file", [(path, size)])``."""
    if os.path.isdir(path):
        return "folder", _walk(path)
    if os.path.isfile(path):
        if Path(path).suffix.lower() in MANIFEST_SUFFIXES:
            return "manifest", None
        return "file", [(path, os.stat(path).st_size)]
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise SourceNotFound(f"{path}: no such file or folder")
    files = [(p, size) for p, size in _walk(parent) if p.startswith(path)]
    return "folder", files


async def _list_local(url: str, detail: bool) -> AsyncIterator[Any]:
    from ._files import file_path, read_file

    path = file_path(url)
    as_uri = scheme_of(url) == "file" and url.lower().startswith("file:")
    kind, files = await asyncio.to_thread(_local_listing, path)
    if kind == "manifest":
        text = (await read_file(path)).decode("utf-8", errors="replace")
        _check_not_a_document(text, path, local=True)
        folder = os.path.dirname(path)
        for _, line in _manifest_lines(text):
            local = "://" not in line and not line.lower().startswith("file:")
            entry = os.path.join(folder, line) if local and not os.path.isabs(line) else line
            yield ObjectInfo(entry) if detail else entry
        return
    for found, size in files or []:
        item = Path(os.path.abspath(found)).as_uri() if as_uri else found
        yield ObjectInfo(item, size) if detail else item


def _manifest_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, entry)`` for each line that is neither blank nor a comment."""
    stripped = enumerate((line.strip() for line in text.removeprefix("\ufeff").splitlines()), 1)
    return [(number, line) for number, line in stripped if line and not line.startswith("#")]


def _check_not_a_document(text: str, where: str, *, local: bool = False) -> None:
    """Refuses an HTML, XML or JSON document read where a manifest was expected.

    A local path may well begin with ``[`` or ``<``, so a local manifest is refused only when
    it opens as an HTML or XML document does.
    """
    head = text.removeprefix("\ufeff").lstrip()[:9].lower()
    if local and not head.startswith(("<!doctype", "<html", "<?xml")):
        return
    kind = {"<": "an HTML or XML page", "{": "a JSON document", "[": "a JSON document"}
    if head[:1] in kind:
        raise SourceError(f"{redact_url(where)}: {kind[head[:1]]}, not a list of URLs; "
                          f"list_objects reads {MANIFEST_FORMAT}")


async def _list_manifest_http(
    url: str, detail: bool, retry: Retry | None, timeout: Timeout | None
) -> AsyncIterator[Any]:
    from . import _http

    policy, deadlines = resolve_policy(retry, timeout)
    body = await _http.fetch(url, retry=policy, timeout=deadlines)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{redact_url(url)}: the manifest is not UTF-8 text") from None
    _check_not_a_document(text, url)
    for number, line in _manifest_lines(text):
        if _NOT_IN_A_URL.search(line):
            raise SourceError(f"{redact_url(url)}: line {number} is not a URL; list_objects "
                              f"reads {MANIFEST_FORMAT}")
        entry = urljoin(url, line)
        if scheme_of(entry) == "file":
            raise SourcePermissionError(
                f"{redact_url(url)}: line {number} names a local file; a remote manifest "
                "may only list remote URLs"
            )
        yield ObjectInfo(entry) if detail else entry
