"""``read_bytes``: one call for local paths, ``file://``, ``http(s)://`` and ``s3://``.

Only enabled schemes are read: ``schemes=`` on the call, else the running pipeline's
``schemes`` setting, else all of ``_transport.DEFAULT_SCHEMES``; ``_transport.transport_for``
picks the scheme's transport, as it does for listings and tar shards.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from .._errors import ConfigError
from .._scope import RunScope, use_scope
from ._retry import Retry, Timeout, resolve_policy
from ._transport import ObjectInfo, as_url, enabled_schemes, transport_for

__all__ = ["ObjectInfo", "read_bytes", "session"]

async def read_bytes(
    url: str | os.PathLike[str] | ObjectInfo,
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
) -> bytes:
    """The whole content of a local file, an HTTP(S) resource or an S3 object.

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

    Returns:
        The complete body; a truncated one is never returned.

    Raises:
        SourceNotFound: No such file, object or URL (404), at once.
        SourcePermissionError: Access refused (401, 403), or the scheme is not enabled.
        SourceTimeout: The last try timed out, or ``timeout.total`` passed.
        SourceError: Anything else; the message names the URL (credentials and query values
            masked), the status and the number of attempts.

    Cancellation:
        Cancelling the caller cancels the request or back-off in progress; its connection is
        closed, not reused.
    """
    text = as_url(url)
    transport = transport_for(text, schemes, endpoint_url)
    policy, deadlines = resolve_policy(retry, timeout)
    return await transport.fetch(text, retry=policy, timeout=deadlines)


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
    if connections is not None and (isinstance(connections, bool) or connections < 1):
        raise ConfigError(f"connections must be >= 1, got {connections!r}")
    settings: dict[str, Any] = {
        "retry": retry, "timeout": timeout, "schemes": schemes, "connections": connections,
    }
    resolve_policy(retry, timeout)  # fail on a bad policy now, not on the first read
    if schemes is not None:
        enabled_schemes(schemes)
    scope = RunScope({k: v for k, v in settings.items() if v is not None})
    try:
        with use_scope(scope):
            yield scope
    finally:
        await scope.aclose()
