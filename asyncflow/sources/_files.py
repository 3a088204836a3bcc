"""Local files (plain paths and ``file://`` URLs), read without blocking the event loop.

A whole file is read on a worker thread (:func:`~asyncflow.pipeline.run_thread`) by
:func:`~asyncflow._blob.read_regular`, the reader ``image.decode`` uses too: regular files
only (a FIFO, a device such as ``/dev/zero`` or a socket is refused without blocking), at most
``max_bytes``. A stream opens its file on a worker thread, cancellation-safe: a file whose open
completes after its caller was cancelled is closed, not leaked; aiofiles then runs each read
and close on the loop's default thread pool. Local reads are never retried: a missing or
unreadable file fails at once. :class:`FileTransport` is the
``file`` scheme's transport: whole files, files in chunks, and listings of folders, of path
prefixes and of manifests.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

import aiofiles.threadpool

from .._blob import os_error, read_regular, unreadable_folder
from .._errors import SourceError, SourceNotFound
from .._redact import redact_url
from ..pipeline import run_thread
from ._manifest import MANIFEST_SUFFIXES, local_entries
from ._objects import ObjectInfo
from ._retry import Retry, Timeout

__all__ = ["FileTransport", "file_path", "open_file", "read_file", "stream_file"]

_CHUNK = 1024 * 1024


def file_path(url: str) -> str:
    """The local path of a ``file://`` URL (or of a plain path, returned as is)."""
    if not url.lower().startswith("file:"):
        return url
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise SourceError(f"{redact_url(url)}: file:// URLs on another host are not supported")
    path = unquote(parts.path)
    if not path:
        raise SourceError(f"{redact_url(url)}: no path in the URL")
    return path


class _Opening:
    """One file being opened on a worker thread, which the waiting task may abandon."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        self.abandoned = False
        self.lock = threading.Lock()

    def open(self) -> BinaryIO | None:
        """On the worker: the file open, or ``None`` (closed again) once abandoned."""
        fh = open(self.path, "rb")  # noqa: SIM115 (handed to the waiter, or closed below)
        with self.lock:
            if not self.abandoned:
                self.file = fh
                return fh
        fh.close()
        return None

    def abandon(self) -> None:
        """On the loop: the waiter stopped waiting; close the file if it is open already,
        else the worker closes it once it is."""
        with self.lock:
            self.abandoned = True
            fh, self.file = self.file, None
        if fh is not None:
            fh.close()  # a file opened for reading: too little to hand off


@asynccontextmanager
async def open_file(path: str) -> AsyncIterator[Any]:
    """``async with open_file(path) as fh``: ``path`` opened for reading, as aiofiles' async
    reader, closed on exit.

    Raises:
        OSError: The file could not be opened.

    Cancellation:
        Safe: the wait for the open stops at once; a file whose open completes afterwards on
        its thread is closed there (or here, if it already was), never left open. A close
        whose wait is cancelled completes on its thread.
    """
    opening = _Opening(path)
    try:
        raw = await run_thread(opening.open)
    except BaseException:
        opening.abandon()
        raise
    assert raw is not None  # only an abandoned open returns None
    fh = aiofiles.threadpool.wrap(raw, loop=asyncio.get_running_loop())
    try:
        yield fh
    finally:
        await fh.close()


async def read_file(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """The whole regular file at ``path``, if it holds at most ``max_bytes``.

    Raises:
        SourceNotFound: No such file.
        SourcePermissionError: The file may not be read.
        SourceError: Not a regular file (a directory, a FIFO, a device, a socket), over
            ``max_bytes``, or any other OS error; the message names the path.

    Cancellation:
        Cancelling the caller abandons the thread-pool call, which finishes on its own (the
        open never blocks, the read is bounded) and closes the file.
    """
    name = os.fspath(path)
    return await run_thread(read_regular, name, name, max_bytes)


async def stream_file(path: str) -> AsyncGenerator[bytes, None]:
    """The bytes of ``path``, in chunks.

    Cancellation:
        As :func:`read_file`: the file is closed, the pending read or open abandoned.
    """
    try:
        async with open_file(path) as fh:
            while chunk := await fh.read(_CHUNK):
                yield chunk
    except OSError as exc:
        raise os_error(exc, path) from exc


def _walk(root: str) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for folder, _dirs, files in os.walk(root, onerror=unreadable_folder):
        for name in files:
            path = os.path.join(folder, name)
            try:
                size = os.stat(path).st_size
            except OSError:
                continue  # vanished or a dangling link: not an object
            found.append((path, size))
    found.sort()  # whole paths in order, as an S3 listing orders keys
    return found


def _local_listing(path: str) -> list[tuple[str, int]] | None:
    """``(path, size)`` of each file in a folder, of a file, or of each file whose path
    starts with ``path`` (a prefix); ``None`` for a manifest."""
    if os.path.isdir(path):
        return _walk(path)
    if os.path.isfile(path):
        if Path(path).suffix.lower() in MANIFEST_SUFFIXES:
            return None
        return [(path, os.stat(path).st_size)]
    parent = os.path.dirname(path)
    if not os.path.isdir(parent or "."):
        raise SourceNotFound(f"{path}: no such file or folder")
    if parent:
        return [(p, size) for p, size in _walk(parent) if p.startswith(path)]
    # A prefix in the working folder: its files' paths as given, without "./".
    here = len(os.path.join(os.curdir, ""))
    return [(p[here:], size) for p, size in _walk(os.curdir) if p[here:].startswith(path)]


class FileTransport:
    """Local paths and ``file://`` URLs; ``retry`` and ``timeout`` do not apply."""

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        return await read_file(file_path(url))

    def stream(self, url: str, *, retry: Retry, timeout: Timeout) -> AsyncGenerator[bytes, None]:
        return stream_file(file_path(url))

    async def list(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[ObjectInfo, None]:
        """A folder's files (recursively, sorted), a prefix's, or a manifest's entries.

        Entries are paths, or ``file://`` URLs when ``url`` is one.
        """
        path = file_path(url)
        as_uri = url.lower().startswith("file:")
        files = await run_thread(_local_listing, path)
        if files is None:  # a manifest
            for entry in local_entries(await read_file(path), path):
                yield entry
            return
        for found, size in files:
            yield ObjectInfo(Path(os.path.abspath(found)).as_uri() if as_uri else found, size)
