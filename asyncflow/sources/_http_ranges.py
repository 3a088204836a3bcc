"""Resumable HTTP reads: one try at a body from a byte offset, proven to continue one object.

A try resumed with ``Range`` carries ``If-Range`` with the strong ETag or Last-Modified date
of the first answer (:class:`Resume`), and without one the body starts again from zero.
Content-Range is validated before use (well-formed, in bounds, the range asked for).

An object with nothing to prove it unchanged (no strong validator, or a content-encoded
body), or a server that ignores ``Range`` and answers 200, is read again from byte 0: the
bytes already delivered are hashed as they go (only for such objects), and the new answer's
first bytes must hash the same before the read continues past them; other bytes are an error
that names the object, never a splice of two versions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import aiohttp

from .._errors import SourceError
from ._http_session import MAX_CONTENT_LENGTH, body, coding, content_length, get
from ._retry import Retry, Timeout, http_date
from ._tries import Changed

__all__ = ["Resume", "stream"]

_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20})")
_UNSATISFIED = re.compile(r"bytes \*/([0-9]{1,20})")


class Resume:
    """What the first answer told about an object, which every resumed answer must match.

    One per read: give the same instance to each :func:`stream` call of that read. A resumed
    request carries ``If-Range`` with the strong ETag (else a strong Last-Modified date), so a
    server whose object changed answers with the new object whole instead of a piece of it.
    """

    __slots__ = ("encoded", "etag", "last_modified", "prefix", "total")

    def __init__(self) -> None:
        self.etag: str | None = None
        self.last_modified: str | None = None
        self.total: int | None = None
        self.encoded = False
        #: The digest of the bytes delivered so far, kept only while nothing else can prove
        #: a later answer continues the same object (no :meth:`if_range`).
        self.prefix: Any = None

    def learn(self, resp: aiohttp.ClientResponse, length: int | None) -> None:
        """Take the validators and size of a whole (non-range) answer."""
        etag = resp.headers.get("ETag")
        self.etag = etag if etag and etag.startswith('"') else None  # W/"..." cannot prove
        # RFC 9110 13.1.5: a date only where there is no entity tag, and only a strong one
        # (at least a second older than the answer's Date).
        modified, date = resp.headers.get("Last-Modified"), resp.headers.get("Date")
        when, now = http_date(modified), http_date(date)
        strong = etag is None and when is not None and now is not None and now - when >= 1
        self.last_modified = modified if strong else None
        self.total = length
        self.encoded = coding(resp) != "identity"
        self.prefix = hashlib.sha256() if self.if_range() is None else None

    def if_range(self) -> str | None:
        """The ``If-Range`` value that proves a resumed answer continues this object."""
        # A decoder's state dies with its connection, so an encoded body is never resumed.
        return None if self.encoded else self.etag or self.last_modified

    def same(self, resp: aiohttp.ClientResponse, length: int | None) -> bool:
        """Whether a whole answer is the very object this read began with."""
        validator = self.if_range()
        header = resp.headers.get("ETag" if self.etag else "Last-Modified")
        return validator is not None and header == validator and length == self.total


def _range_answer(
    resp: aiohttp.ClientResponse, offset: int, resume: Resume, length: int | None, what: object
) -> int:
    """How many bytes a 206 to ``Range: bytes=<offset>-`` holds; refuses any other range."""
    raw = resp.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(raw.strip())
    asked = f"bytes={offset}-" + (f" of {resume.total}" if resume.total is not None else "")
    if match is None:
        raise SourceError(f"{what}: HTTP 206 with an unusable Content-Range {raw[:60]!r} "
                          f"(asked for {asked})")
    header = "ETag" if resume.etag else "Last-Modified"
    sent = resp.headers.get(header)
    if sent is not None and sent != resume.if_range():
        raise Changed(f"{what}: the object changed (another {header}) between tries")
    start, end, total = (int(g) for g in match.groups())
    if start != offset or end != total - 1 or total > MAX_CONTENT_LENGTH or (
        resume.total is not None and total != resume.total
    ) or (length is not None and length != end - start + 1):
        raise SourceError(f"{what}: HTTP 206 answered {raw[:60]!r} with Content-Length "
                          f"{length} to a request for {asked}")
    if coding(resp) != "identity":
        raise SourceError(f"{what}: HTTP 206 with a Content-Encoding to a resumed request")
    return end - start + 1


def _ends_at(resp: aiohttp.ClientResponse, offset: int, resume: Resume, what: object) -> None:
    """A 416 to ``Range: bytes=<offset>-`` (with ``If-Range``: the same object): nothing is
    left when the object ends exactly at ``offset`` (a body without Content-Length whose
    connection broke after its last byte); any other 416 is an error naming the object."""
    raw = resp.headers.get("Content-Range", "")
    match = _UNSATISFIED.fullmatch(raw.strip())
    if match is None or int(match.group(1)) != offset or resume.total not in (None, offset):
        raise SourceError(f"{what}: HTTP 416 with Content-Range {raw[:60]!r} to a request for "
                          f"bytes={offset}-")


class _Replay:
    """An answer read again from byte 0: its first ``offset`` bytes, those already delivered,
    are skipped; where nothing else proves it the same object (no validator), their digest
    must be the one kept."""

    __slots__ = ("digest", "left", "offset", "want", "what")

    def __init__(self, resume: Resume, offset: int, what: object) -> None:
        self.want = None if resume.prefix is None else resume.prefix.digest()
        self.digest = hashlib.sha256()
        self.left = self.offset = offset
        self.what = what

    def skip(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` past the replayed prefix (checked once it is all in)."""
        cut = min(self.left, len(chunk))
        self.digest.update(chunk[:cut])
        self.left -= cut
        if not self.left and self.want not in (None, self.digest.digest()):
            raise Changed(f"{self.what}: the object changed: read again from byte 0 (nothing "
                          f"proves a resumed range continues it), its first {self.offset} "
                          "bytes differ from those already read; cannot continue")
        return chunk[cut:]

    def finish(self) -> None:
        if self.left:
            raise Changed(f"{self.what}: the object changed: read again from byte 0, it ends "
                          f"after {self.offset - self.left} bytes, before the {self.offset} "
                          "already read; cannot continue")


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    offset: int,
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    resume: Resume,
) -> AsyncGenerator[bytes, None]:
    """One try at the body of ``url`` from byte ``offset`` on, in chunks.

    Args:
        resume: What proves that a resumed try continues the object the first try began
            (one :class:`Resume` per read, given to every try).

    Raises:
        Transient: A failure worth resuming from where it stopped.
        SourceError: The object changed since the read began (its validator, or, without
            one, the digest of the bytes already yielded, read again from byte 0), so they
            cannot be continued; or the server answered another range than asked for.
    """
    validator = resume.if_range() if offset else None
    headers = {"Range": f"bytes={offset}-", "If-Range": validator} if validator else None
    resp = await get(session, url, what=what, retry=retry, timeout=timeout, headers=headers)
    try:
        if resp.status == 416:
            _ends_at(resp, offset, resume, what)
            return
        expected = content_length(resp, what)
        replay = None
        if resp.status == 206:
            if headers is None:
                raise SourceError(f"{what}: HTTP 206 to a request without Range")
            expected = _range_answer(resp, offset, resume, expected, what)
        elif not offset:
            resume.learn(resp, expected)
        else:  # the whole object again (it cannot be resumed, changed, or ranges are ignored)
            if resume.prefix is None and not resume.same(resp, expected):
                raise Changed(f"{what}: the object changed after {offset} bytes were read; "
                              "cannot resume")
            replay = _Replay(resume, offset, what)  # what was read is skipped, or checked
        async with aclosing(body(resp, expected, what, timeout)) as chunks:
            async for chunk in chunks:
                if replay is not None and replay.left:
                    chunk = replay.skip(chunk)
                    if not chunk:
                        continue
                if resume.prefix is not None:
                    resume.prefix.update(chunk)
                yield chunk
        if replay is not None:
            replay.finish()
    finally:
        resp.release()
