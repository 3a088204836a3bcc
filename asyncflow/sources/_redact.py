"""The sources' names for :mod:`asyncflow._redact`, the package's one redactor."""

from __future__ import annotations

from .._redact import MASK, Operation, describe_exception, redact_text, redact_url

__all__ = ["MASK", "Operation", "describe_exception", "redact_text", "redact_url"]
