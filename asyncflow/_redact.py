"""Redaction of secrets in text that reaches logs, errors and reprs."""

from __future__ import annotations

import re

__all__ = ["redact"]

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")
_QUERY = re.compile(r"(?P<base>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?'\"]*)\?[^\s#'\"]*")
_AWS_KEY = re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b")
_SECRETS = re.compile(
    r"(?i)(?P<key>aws_secret_access_key|aws_session_token|secret|token|password|signature"
    r"|x-amz-signature|x-amz-security-token|x-amz-credential)(?P<sep>\s*[=:]\s*)[^\s&,'\"]+"
)


def redact(text: str) -> str:
    """Mask URL credentials and query strings, AWS key ids and ``secret=...`` pairs."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    text = _QUERY.sub(r"\g<base>?***", text)
    text = _AWS_KEY.sub("AKIA****************", text)
    return _SECRETS.sub(r"\g<key>\g<sep>***", text)
