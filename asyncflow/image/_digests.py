"""Tokens of image files: what a resume state identifies each listed file by.

A resume state must tell a tree it can resume from one it cannot, for a million files, when
it is saved and when it is loaded. Hashing every byte would read the whole dataset (hours on
ImageNet) each time, so each file stands by its **size** and a hash of its **first and last
KiB** (one read for a file up to 2 KiB): a file added, removed, renamed or swapped for
another image changes the listing; a file rewritten to another size, or with another start
(the header's first bytes) or end (the last scan data, which any other picture changes),
changes its token. A change of pixels in the middle of a file of the same size, with the same
ends, is not seen there: the journal (``asyncflow/journal/``) records a digest of each
decoded file's whole bytes (``asyncflow.pipeline.short_digest``), which ``rebuild`` checks.

That costs about 14 microseconds a file from the page cache on our two-core machine (an
open, two small reads, a hash): about as much as a ``stat`` and an ``open``. The reads run on
a few threads, for a network file system, where each waits on a round trip.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..pipeline import short_digest

__all__ = ["END", "file_token", "file_tokens", "relative_names"]

#: Bytes read at each end of a file for its token.
END = 1024
_THREADS = 16
_CHUNK = 512  # files per task


def relative_names(paths: Sequence[str]) -> list[str]:
    """``paths`` under their common folder (``/data/train/cat/1.jpg`` -> ``cat/1.jpg`` when
    every path is under ``/data/train``): the same tree at another root has the same names."""
    if not paths:
        return []
    try:  # the lexical extremes share the prefix that every path between them has
        common = os.path.commonpath([os.path.dirname(min(paths)),
                                     os.path.dirname(max(paths))])
    except ValueError:  # absolute and relative paths mixed: nothing in common
        common = ""
    cut = len(common) + 1 if common and not common.endswith(os.sep) else len(common)
    return [p[cut:] for p in paths]


def file_token(path: str) -> str:
    """``"<size>:<hash of the first and last END bytes>"``; ``"missing"`` / ``"not a file"``
    for a path that is gone or is not a regular file (its contents cannot be told)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return "missing"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a file"
        size = info.st_size
        if size <= 2 * END:
            ends = os.pread(fd, size, 0)
        else:
            ends = os.pread(fd, END, 0) + os.pread(fd, END, size - END)
        return f"{size}:{short_digest(ends)}"
    except OSError:
        return "unreadable"
    finally:
        os.close(fd)


def _tokens(paths: Sequence[str]) -> list[str]:
    return [file_token(p) for p in paths]


def file_tokens(paths: Sequence[str]) -> list[str]:
    """:func:`file_token` of each path, in order, read on a few threads.

    Cancellation:
        Blocks until every file is read; the threads end with it.
    """
    if len(paths) <= _CHUNK:
        return _tokens(paths)
    chunks = [paths[i:i + _CHUNK] for i in range(0, len(paths), _CHUNK)]
    with ThreadPoolExecutor(min(_THREADS, len(chunks)),
                            thread_name_prefix="asyncflow-digest") as pool:
        return [token for tokens in pool.map(_tokens, chunks) for token in tokens]
