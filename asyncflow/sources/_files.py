"""Local files (plain paths and ``file://`` URLs), read without blocking the event loop.

aiofiles runs each open, read and close on the loop's default thread pool. Local reads are
never retried: a missing or unreadable file fails at once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from urllib.parse import unquote, urlsplit

import aiofiles

from .._errors import SourceError, SourceNotFound, SourcePermissionError

__all__ = ["file_path", "read_file", "stream_file"]

_CHUNK = 1024 * 1024


def file_path(url: str) -> str:
    """The local path of a ``file://`` URL (or of a plain path, returned as is)."""
    if not url.lower().startswith("file:"):
        return url
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise SourceError(f"{url}: file:// URLs on another host are not supported")
    path = unquote(parts.path)
    if not path:
        raise SourceError(f"{url}: no path in the URL")
    return path


def _translate(exc: OSError, path: str) -> SourceError:
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return SourceNotFound(f"{path}: {reason}")
    if isinstance(exc, PermissionError):
        return SourcePermissionError(f"{path}: {reason}")
    return SourceError(f"{path}: {reason}")


async def read_file(path: str | os.PathLike[str]) -> bytes:
    """The whole file at ``path``.

    Raises:
        SourceNotFound: No such file.
        SourcePermissionError: The file may not be read.
        SourceError: Any other OS error (a directory, an I/O error), naming the path.

    Cancellation:
        Cancelling the caller abandons the pending thread-pool call (which finishes on its own)
        and closes the file.
    """
    name = os.fspath(path)
    try:
        async with aiofiles.open(name, "rb") as fh:
            data: bytes = await fh.read()
    except OSError as exc:
        raise _translate(exc, name) from exc
    return data


async def stream_file(path: str, offset: int = 0) -> AsyncGenerator[bytes, None]:
    """The bytes of ``path`` from ``offset`` on, in chunks."""
    try:
        async with aiofiles.open(path, "rb") as fh:
            if offset:
                await fh.seek(offset)
            while chunk := await fh.read(_CHUNK):
                yield chunk
    except OSError as exc:
        raise _translate(exc, path) from exc
