"""``read_bytes``: one call for local paths, ``file://``, ``http(s)://`` and ``s3://``.

Only enabled schemes are read: ``schemes=`` on the call, else the running pipeline's
``schemes`` setting, else all of ``_transport.DEFAULT_SCHEMES``; ``_transport.transport_for``
picks the scheme's transport, as it does for listings and tar shards.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing, asynccontextmanager
from typing import Any

from .._blob import Blob, check_max_bytes, describe_size, over_max_bytes
from .._errors import check_int
from .._redact import redact_url
from .._scope import RunScope, use_scope
from ._retry import Retry, Timeout, resolve_policy
from ._transport import ObjectInfo, Transport, as_url, enabled_schemes, scheme_of, transport_for

__all__ = ["ObjectInfo", "read_bytes", "session"]


async def read_bytes(
    url: str | os.PathLike[str] | ObjectInfo,
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
    max_bytes: int | None = None,
) -> Blob:
    """The whole content of a local file, an HTTP(S) resource or an S3 object.

    The bytes come back as a :class:`~asyncflow._blob.Blob`: ``bytes`` that carry their
    ``url``, so that a later stage failing on them (``image.decode``, a parser) names the
    object, not the payload. A local path is read only if it is a regular file (a FIFO, a
    device such as ``/dev/zero`` or a socket is refused at once).

    Inside a pipeline run, every call shares one aiohttp session and one S3 client, closed
    when the run stops. Outside a run, each call opens and closes its own, unless the calls
    sit inside ``async with asyncflow.sources.session():``.

    Args:
        url: A path, ``file://``, ``http://``, ``https://`` or ``s3://bucket/key`` URL, or an
            :class:`ObjectInfo` from :func:`list_objects`.
        retry: Retry policy; default: the pipeline's, else ``Retry()``.
        timeout: Deadlines; default: the pipeline's, else ``Timeout()``.
        schemes: The schemes that may be read; default: the pipeline's, else all.
        endpoint_url: An S3-compatible endpoint; default: the standard AWS configuration
            (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the config file).
        max_bytes: Refuse an object larger than this, before reading it where its size is
            known (a local file, an :class:`ObjectInfo` with a size), else as soon as more
            arrived (the body is then streamed, never held past the limit). Default
            ``None``: no limit, as a generic byte reader (tar shards, checkpoints); give
            one where the objects should be small (images: ``image.DEFAULT_MAX_BYTES``).

    Returns:
        The complete body; a truncated one is never returned.

    Raises:
        SourceNotFound: No such file, object or URL (404), at once.
        SourcePermissionError: Access refused (401, 403), or the scheme is not enabled.
        SourceTimeout: The last try timed out, or ``timeout.total`` passed.
        SourceError: Over ``max_bytes``, not a regular file, or anything else; the message
            names the URL (credentials and query values masked), the status and the number
            of attempts.

    Cancellation:
        Cancelling the caller cancels the request or back-off in progress; its connection is
        closed, not reused.
    """
    text = as_url(url)
    transport = transport_for(text, schemes, endpoint_url)
    policy, deadlines = resolve_policy(retry, timeout)
    if max_bytes is None:
        return Blob(await transport.fetch(text, retry=policy, timeout=deadlines), text)
    check_max_bytes(max_bytes)
    if isinstance(url, ObjectInfo) and url.size is not None and url.size > max_bytes:
        raise over_max_bytes(redact_url(text), f"{describe_size(url.size)} (listed)",
                             max_bytes)
    if scheme_of(text) == "file":
        from ._files import file_path, read_file

        return Blob(await read_file(file_path(text), max_bytes=max_bytes), text)
    return Blob(await _read_capped(transport, text, policy, deadlines, max_bytes), text)


async def _read_capped(
    transport: Transport, url: str, retry: Retry, timeout: Timeout, max_bytes: int
) -> bytes:
    """A remote body through the transport's resumable stream, given up past ``max_bytes``."""
    chunks: list[bytes] = []
    total = 0
    async with aclosing(transport.stream(url, retry=retry, timeout=timeout)) as body:
        async for chunk in body:
            total += len(chunk)
            if total > max_bytes:
                raise over_max_bytes(redact_url(url), f"more than {describe_size(max_bytes)}",
                                     max_bytes)
            chunks.append(chunk)
    return b"".join(chunks)


@asynccontextmanager
async def session(
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    connections: int | None = None,
) -> AsyncIterator[RunScope]:
    """Share one HTTP session and one S3 client among the calls inside the block.

    Outside a pipeline, ``read_bytes`` otherwise opens a connection pool per call. The
    pool is closed when the block ends, whatever way it ends::

        async with asyncflow.sources.session(retry=Retry(attempts=3)):
            blobs = await asyncio.gather(*(asyncflow.read_bytes(u) for u in urls))

    Args:
        retry: Default retry policy for the calls inside.
        timeout: Default deadlines for the calls inside.
        schemes: The schemes that may be read inside.
        connections: Most HTTP connections open at once (default 256); more requests wait.
    """
    check_int("connections", connections, allow_none=True)
    settings: dict[str, Any] = {
        "retry": retry, "timeout": timeout, "schemes": schemes, "connections": connections,
    }
    # Fail on a bad policy or scheme now, not on the first read.
    resolve_policy(retry, timeout)
    enabled_schemes(schemes)
    scope = RunScope({k: v for k, v in settings.items() if v is not None})
    try:
        with use_scope(scope):
            yield scope
    finally:
        await scope.aclose()
