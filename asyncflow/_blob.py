"""Bytes that name where they came from, and the one reader of whole local files.

:class:`Blob` is what ``read_bytes`` returns: ``bytes`` that also carry the URL or path they
were read from, so that a stage failing on them later (``image.decode``, a user's parser)
names the object, not the payload: its ``repr`` (which error notes, logs and failure
records show) is ``<Blob of 1878 bytes from 's3://bucket/key'>``.

:func:`read_regular` reads a local file whole for ``read_bytes`` (on a worker thread) and
``image.decode`` (in the caller's thread) alike: regular files only, at most ``max_bytes``.
A link to ``/dev/zero``, a FIFO, a socket or a device is refused before a byte is read, and
opening never blocks (a FIFO is opened with ``O_NONBLOCK``, then refused).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ._errors import SourceError, SourceNotFound, SourcePermissionError, check_int
from ._redact import redact_url

__all__ = ["Blob", "check_max_bytes", "describe_size", "os_error", "over_max_bytes", "read_regular",
           "unreadable_folder"]

_CHUNK = 1 << 20
_KINDS = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
)


class Blob(bytes):
    """``bytes`` read from ``url`` (a URL or a local path), which its ``repr`` names.

    Everything else is plain ``bytes``: slices and methods return ``bytes``, and it compares
    equal to the same bytes.

    Attributes:
        url: Where the bytes were read from.
    """

    url: str  # in the instance's __dict__: bytes subtypes cannot have __slots__

    def __new__(cls, data: bytes | bytearray | memoryview, url: str) -> Blob:
        blob = super().__new__(cls, data)
        blob.url = url
        return blob

    def __repr__(self) -> str:
        return f"<Blob of {len(self)} bytes from {redact_url(self.url)!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return Blob, (bytes(self), self.url)


def check_max_bytes(max_bytes: object) -> None:
    """Refuse a ``max_bytes`` that is not an int >= 0 or ``None`` (``ConfigError``)."""
    check_int("max_bytes", max_bytes, 0, allow_none=True)


def describe_size(size: int) -> str:
    """``"3.2 MiB (3,355,443 bytes)"``: a size for an error message."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit} ({size:,} bytes)"
    return f"{size:,} bytes"


def read_regular(path: str | os.PathLike[str], label: str, max_bytes: int | None) -> bytes:
    """The whole content of the regular file at ``path``, if it holds at most ``max_bytes``.

    Args:
        path: The file (links are followed: a link to a regular file is read).
        label: How errors name the file.
        max_bytes: The most bytes read; ``None`` for no limit. A file that grows past it
            while it is read is refused as well.

    Raises:
        SourceNotFound: No such file.
        SourcePermissionError: The file may not be read.
        SourceError: It is not a regular file (a directory, a FIFO, a socket, a device:
            ``/dev/zero`` would never end), it holds more than ``max_bytes``, or another OS
            error; the message names ``label``.

    Cancellation:
        Blocks its thread for the read; the open never blocks (``O_NONBLOCK``), so an
        abandoned call ends on its own once the (bounded) read is done.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise os_error(exc, label) from exc
    try:
        info = os.fstat(fd)
        _check_regular(info.st_mode, label)
        _check_size(info.st_size, label, max_bytes)
        return _read_capped(fd, info.st_size, label, max_bytes)
    except OSError as exc:
        raise os_error(exc, label) from exc
    finally:
        os.close(fd)


def os_error(exc: OSError, label: str) -> SourceError:
    """The asyncflow error for an OS error on the file ``label`` names: not found, refused,
    or another failure."""
    if isinstance(exc, FileNotFoundError):
        return SourceNotFound(f"{label}: no such file")
    if isinstance(exc, PermissionError):
        return SourcePermissionError(f"{label}: permission denied")
    return SourceError(f"{label}: {exc.strerror or exc}")


def unreadable_folder(exc: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder the walk cannot read (permission, I/O) is an error
    naming it, never a listing silently short of its files; one that vanished meanwhile holds
    nothing."""
    if not isinstance(exc, FileNotFoundError):
        raise os_error(exc, str(exc.filename)) from exc


def _check_regular(mode: int, label: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise SourceError(f"{label}: is {kind}, not a regular file; only regular files are read")


def over_max_bytes(label: str, size: str, max_bytes: int) -> SourceError:
    """The error for an object of ``size`` (described) over ``max_bytes``, naming ``label``."""
    return SourceError(f"{label}: {size}, over max_bytes={max_bytes:,} "
                       "(pass a larger max_bytes= to read it)")


def _check_size(size: int, label: str, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise over_max_bytes(label, describe_size(size), max_bytes)


def _read_capped(fd: int, size: int, label: str, max_bytes: int | None) -> bytes:
    """Read to the end: one read of the size ``stat`` gave plus a byte (is there more?), then
    chunks; the file may have grown, a read may return less than asked, and some files
    (in /proc) report a size of 0."""
    want = size if max_bytes is None else min(size, max_bytes)
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, want + 1 - total if total <= want else _CHUNK):
        chunks.append(chunk)
        total += len(chunk)
        _check_size(total, label, max_bytes)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
