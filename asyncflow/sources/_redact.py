"""Keeping secrets out of messages: URLs with credentials, presigned signatures, AWS keys.

Every URL that asyncflow puts into an error message, a log record, a repr or a sample's
``__url__`` goes through :func:`redact_url` first: user info and every query value are
replaced by ``***`` (query *names* stay, so a presigned URL still reads as one), and the
fragment is dropped. :func:`redact_text` scrubs free text (a foreign exception's message)
of URLs and of strings that look like AWS access keys.
"""

from __future__ import annotations

import os
import re
from urllib.parse import SplitResult, parse_qsl, urlsplit

from .._redact import redact as redact_pairs

__all__ = ["MASK", "Operation", "describe_exception", "redact_text", "redact_url"]

MASK = "***"

# An AWS access key id (AKIA... long-term, ASIA... temporary) and the 40-character secret.
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}\b")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_ENV_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def redact_url(url: object) -> str:
    """``url`` with user info and query values masked and the fragment dropped.

    >>> redact_url("https://user:pw@host/a.jpg?X-Amz-Signature=abc&v=1#f")
    'https://***@host/a.jpg?X-Amz-Signature=***&v=***'
    """
    text = os.fspath(url) if isinstance(url, os.PathLike) else str(url)
    if "://" not in text or text[:5].lower() == "s3://":
        # A local path or an S3 key: no credentials ride in them, and an S3 key may hold a
        # literal "?" that is part of its name, not a query.
        return text
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = MASK + "@" + netloc.rpartition("@")[2]
        query = ""
        if parts.query:
            names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
            query = "&".join(f"{name}={MASK}" for name in names) if names else MASK
        return SplitResult(parts.scheme, netloc, parts.path, query, "").geturl()
    except ValueError:
        # Unparseable (a bad port, stray brackets): keep only what precedes any secret.
        head = text.split("?", 1)[0].split("#", 1)[0]
        scheme, _, rest = head.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}" if "@" in rest else head


def redact_text(text: str) -> str:
    """``text`` with URLs redacted, anything shaped like an AWS key masked, and the values
    of ``secret=...`` / ``token: ...`` pairs masked."""
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    for name in _ENV_SECRETS:
        secret = os.environ.get(name)
        if secret and len(secret) >= 8:
            text = text.replace(secret, MASK)
    text = _AWS_KEY_ID.sub(MASK, text)
    text = _AWS_SECRET.sub(_mask_if_secret, text)
    return redact_pairs(text)


def _mask_if_secret(match: re.Match[str]) -> str:
    # A secret access key is 40 random base64 characters: it mixes cases and digits, where a
    # hex digest (an ETag, a SHA-1 in a file name) of the same length does not.
    word = match.group(0)
    mixed = any(c.isupper() for c in word) and any(c.islower() for c in word)
    return MASK if mixed and any(c.isdigit() for c in word) else word


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` of a foreign exception, redacted, for an error message."""
    message = redact_text(str(exc)).strip()
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


class Operation:
    """``"GET <redacted url>"`` for messages, redacted only if a message is ever made.

    Redacting costs a URL parse; a read that succeeds never needs it.
    """

    __slots__ = ("_method", "_text", "_url")

    def __init__(self, method: str, url: str) -> None:
        self._method = method
        self._url = url
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = f"{self._method} {redact_url(self._url)}"
        return self._text

    def __repr__(self) -> str:
        return f"Operation({str(self)!r})"
