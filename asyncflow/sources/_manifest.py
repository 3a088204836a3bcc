"""Manifests: plain-text lists of URLs, one a line, as ``list_objects`` reads them.

A manifest is read by the transport that holds it (a local file, an ``http(s)://`` URL);
this module turns its text into entries, and refuses a document that is not a manifest (an
HTML directory page, a JSON document) rather than turning it into URLs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from urllib.parse import urljoin

from .._errors import SourceError, SourcePermissionError
from .._redact import redact_url
from ._objects import ObjectInfo, scheme_of

__all__ = ["MANIFEST_FORMAT", "MANIFEST_SUFFIXES", "local_entries", "remote_entries"]

MANIFEST_SUFFIXES = frozenset({".txt", ".lst", ".list", ".manifest"})
MANIFEST_FORMAT = (
    "a manifest: UTF-8 plain text with one URL per line (relative ones resolved against the "
    "manifest's URL; blank lines and lines starting with '#' skipped)"
)
# Characters that RFC 3986 never allows in a URL, so a line holding one is not a URL.
_NOT_IN_A_URL = re.compile(r'[\s<>"{}|\\^`\x00-\x1f\x7f]')


def _lines(text: str) -> list[tuple[int, str]]:
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


def local_entries(data: bytes, path: str) -> Iterator[ObjectInfo]:
    """The entries of the local manifest at ``path``; relative paths are taken from its folder."""
    text = data.decode("utf-8", errors="replace")
    _check_not_a_document(text, path, local=True)
    folder = os.path.dirname(path)
    for _, line in _lines(text):
        local = "://" not in line and not line.lower().startswith("file:")
        yield ObjectInfo(os.path.join(folder, line) if local and not os.path.isabs(line) else line)


def remote_entries(data: bytes, url: str) -> Iterator[ObjectInfo]:
    """The entries of the manifest at ``url``: remote URLs only, each line checked."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{redact_url(url)}: the manifest is not UTF-8 text") from None
    _check_not_a_document(text, url)
    for number, line in _lines(text):
        if _NOT_IN_A_URL.search(line):
            raise SourceError(f"{redact_url(url)}: line {number} is not a URL; list_objects "
                              f"reads {MANIFEST_FORMAT}")
        entry = urljoin(url, line)
        if scheme_of(entry) == "file":
            raise SourcePermissionError(
                f"{redact_url(url)}: line {number} names a local file; a remote manifest "
                "may only list remote URLs"
            )
        yield ObjectInfo(entry)
