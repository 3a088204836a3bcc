"""Keeping secrets out of text that reaches logs, error messages, notes, reprs and HTML.

The one redactor of the package. What it masks:

* URLs: user info (``user:password@``) and every query *value* (names stay, so a presigned
  URL still reads as one); the fragment is dropped. An ``s3://bucket/key`` keeps its key (a
  key may hold a literal ``?``) but for the values of secret-named pairs in it (below): a
  presigned query pasted after ``s3://`` reads ``s3://b/k?X-Amz-Signature=***``.
* ``name=value`` / ``name: value`` pairs (quoted or not) whose name says secret, and their
  percent-encoded form (``X-Amz-Signature%3D...%26``, as botocore prints a key in a URL
  path): ``aws_secret_access_key``, ``aws_session_token``, ``X-Amz-Signature``,
  ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``AWSAccessKeyId``, ``Signature``,
  ``sig``, ``password``, ``token``, ``secret`` ...
* ``Authorization`` headers (the whole value) and ``Bearer`` tokens.
* AWS access key ids (``AKIA...``, ``ASIA...``), and, appearing raw, anything shaped like a
  secret access key (40 base64 characters mixing cases and digits; a hex digest of the same
  length is kept) or a session token (100+ such characters).
* The values of ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` in the environment.
"""

from __future__ import annotations

import logging
import os
import re
import reprlib
import traceback
from urllib.parse import SplitResult, parse_qsl, urlsplit

__all__ = [
    "MASK",
    "Operation",
    "describe_exception",
    "describe_item",
    "format_exception",
    "redact",
    "redact_logs",
    "redact_url",
]

MASK = "***"

# A URL ends before trailing punctuation: "GET https://h/x?a=1: 503" keeps its colon.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)\]]")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|AIPA)[A-Z0-9]{12,}\b")
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+=]{40,}(?![A-Za-z0-9/+=])")
_SECRET_NAMES = (
    r"aws_secret_access_key|aws_session_token|aws_security_token|secret_access_key"
    r"|x-amz-signature|x-amz-security-token|x-amz-credential|session_token|sessiontoken"
    r"|client_secret|api_key|apikey|access_token|refresh_token|password|passwd|secret"
    r"|signature|credential|token|accesskeyid|access_key_id|sig"
)
#: A word in every one of those names: text holding none of them has no pair to mask (a
#: test holds this), and skips the pair patterns, the costliest of all.
_NAME_HINTS = ("sig", "token", "secret", "credential", "passw", "api_key", "apikey",
               "accesskeyid", "access_key_id")
_PAIRS = re.compile(
    rf"(?i)(?P<key>{_SECRET_NAMES})(?P<sep>['\"]?\s*[=:]\s*['\"]?)"
    r"(?!\*\*\*)[^\s&,;'\"})\]]*[^\s&,;:.'\"})\]]"  # a trailing ':' or '.' is prose
)
# The same pair percent-encoded once or more ("%3D", "%253D"), as a key is in a URL's path;
# its value ends at an encoded "&" ("%26"), as a query's would.
_ENCODED_PAIRS = re.compile(
    rf"(?i)(?P<key>{_SECRET_NAMES})(?P<sep>%(?:25)*3D)"
    r"(?!\*\*\*)(?:(?!%(?:25)*26)[^\s&,;'\"})\]])+"
)
_AUTHORIZATION = re.compile(
    r"(?i)(?P<key>\b(?:proxy-)?authorization['\"]?\s*[=:]\s*['\"]?)[^'\"\r\n]+"
)
_BEARER = re.compile(r"(?i)\b(?P<kind>bearer|basic)\s+(?P<token>[A-Za-z0-9._~+/=-]{8,})")
_ENV_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def redact_url(url: object) -> str:
    """``url`` with user info and query values masked and the fragment dropped.

    >>> redact_url("https://user:pw@host/a.jpg?X-Amz-Signature=abc&v=1#f")
    'https://***@host/a.jpg?X-Amz-Signature=***&v=***'
    """
    text = os.fspath(url) if isinstance(url, os.PathLike) else str(url)
    if "://" not in text:
        return text  # a local path: no credentials ride in it
    scheme, _, rest = text.partition("://")
    authority = rest.split("/", 1)[0]
    if "@" in authority:  # user info, masked to its last "@" (a pasted password's "?#@" too)
        text = f"{scheme}://{MASK}@{rest[authority.rindex('@') + 1:]}"
    if scheme.lower() == "s3":
        # An S3 key may hold a literal "?" that is part of its name, not a query: only the
        # values of secret-named pairs in it are masked.
        return _mask_pairs(text)
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = MASK + "@" + netloc.rpartition("@")[2]
        query = ""
        if parts.query:
            names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
            query = "&".join(f"{name}={MASK}" for name in names) if names else MASK
        path = _mask_pairs(parts.path)  # a key botocore put in the path, "k%3Fsig%3D..."
        return SplitResult(parts.scheme, netloc, path, query, "").geturl()
    except ValueError:
        # Unparseable (a bad port, stray brackets): keep only what precedes any secret.
        head = text.split("?", 1)[0].split("#", 1)[0]
        scheme, _, rest = head.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}" if "@" in rest else head


def redact(text: str) -> str:
    """``text`` with every secret this module knows the shape of masked (see above)."""
    text = _AUTHORIZATION.sub(rf"\g<key>{MASK}", text)
    text = _BEARER.sub(_mask_token, text)
    text = _mask_pairs(text)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    for name in _ENV_SECRETS:
        secret = os.environ.get(name)
        if secret and len(secret) >= 8:
            text = text.replace(secret, MASK)
    text = _AWS_KEY_ID.sub(MASK, text)
    return _BASE64_RUN.sub(_mask_if_secret, text)


class _RedactingFilter(logging.Filter):
    """Masks secrets in the records of a library's loggers (botocore logs a request's headers,
    session token included, and its signature at DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = redact(text)
        if masked != text:
            record.msg, record.args = masked, None
        return True


_FILTER = _RedactingFilter()


def redact_logs(*names: str) -> None:
    """Mask secrets in what the loggers ``names`` and those under them record: each such
    logger that exists now gets a redacting filter, once (call again after a library has
    imported more of its modules: its module loggers are made as they are imported). A
    filter costs nothing while its logger's level is off.
    """
    under = tuple(f"{name}." for name in names)
    existing = [name for name in list(logging.root.manager.loggerDict) if name.startswith(under)]
    for name in (*names, *existing):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def _mask_pairs(text: str) -> str:
    lowered = text.lower()
    if not any(hint in lowered for hint in _NAME_HINTS):
        return text
    text = _PAIRS.sub(rf"\g<key>\g<sep>{MASK}", text)
    return _ENCODED_PAIRS.sub(rf"\g<key>\g<sep>{MASK}", text) if "%" in text else text


def _mask_token(match: re.Match[str]) -> str:
    # A credential has digits or base64 padding; "Basic authentication failed" is prose.
    token = match.group("token")
    if any(c.isdigit() for c in token) or token.endswith("="):
        return f"{match.group('kind')} {MASK}"
    return match.group(0)


def _mask_if_secret(match: re.Match[str]) -> str:
    # A secret access key is 40 random base64 characters (a session token, hundreds): they mix
    # cases and digits, where a hex digest (an ETag, a SHA-1 in a file name) does not; and
    # they hold few slashes, where a path of the same characters has one every few letters.
    word = match.group(0)
    if len(word) != 40 and len(word) < 100:
        return word
    mixed = any(c.isupper() for c in word) and any(c.islower() for c in word)
    slashes = word.count("/") <= max(3, len(word) // 16)
    return MASK if mixed and slashes and any(c.isdigit() for c in word) else word


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` of an exception, redacted, for a message, a log or a record."""
    try:
        message = redact(str(exc)).strip()
    except Exception:  # a broken __str__ must not hide the real error
        message = "<message unavailable>"
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


_SPAN = 1 << 16  # characters of a long string redacted (its two ends) before it is shortened


class _ItemRepr(reprlib.Repr):
    """``reprlib``'s short repr, each string and object redacted *before* its middle is cut:
    cut first, a presigned URL's signature would show in its tail, its name cut away."""

    def repr_str(self, x: str, level: int) -> str:
        if len(x) > _SPAN:
            x = x[: _SPAN // 2] + x[-_SPAN // 2:]
        return super().repr_str(redact(x), level)

    def repr_instance(self, x: object, level: int) -> str:
        try:
            text = redact(repr(x))
        except Exception:  # a broken __repr__ must not hide the real error
            return f"<{type(x).__name__} with a failing repr>"
        if len(text) <= self.maxother:
            return text
        head = max(0, (self.maxother - 3) // 2)
        tail = max(0, self.maxother - 3 - head)
        return text[:head] + self.fillvalue + text[len(text) - tail:]


_item_repr = _ItemRepr()
_item_repr.maxstring = _item_repr.maxother = 120
_item_repr.maxlist = _item_repr.maxtuple = _item_repr.maxdict = 4
_item_repr.maxlevel = 2


def describe_item(item: object) -> str:
    """A short, redacted repr of an item for error notes, logs and failure records (the
    journal matches a failure to its source item by this text)."""
    try:
        text = _item_repr.repr(item)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(item).__name__} with a failing repr>"
    return redact(text)


def format_exception(exc: BaseException) -> str:
    """The traceback of ``exc`` (with its notes, causes and sub-exceptions), redacted."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        return describe_exception(exc)
    return redact(text).rstrip()


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
