"""Redaction: credentials, query values, AWS keys never reach a message."""

from __future__ import annotations

import pytest

from asyncflow._redact import Operation, describe_exception, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://host/a.jpg", "https://host/a.jpg"),
        ("https://user:pw@host:8443/a.jpg", "https://***@host:8443/a.jpg"),
        ("https://host/a.jpg?X-Amz-Signature=abc&X-Amz-Credential=AKIA/x",
         "https://host/a.jpg?X-Amz-Signature=***&X-Amz-Credential=***"),
        ("http://host/a?token", "http://host/a?token=***"),
        ("http://host/a#frag-secret", "http://host/a"),
        ("s3://bucket/key?with=odd-chars", "s3://bucket/key?with=odd-chars"),
        ("/data/train/0001.jpg", "/data/train/0001.jpg"),
        ("http://u:p@[::1/x?sig=1", "http://[::1/x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_masks_urls_keys_and_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLESESSIONTOKEN")
    text = redact_text(
        "GET https://u:pw@h/x?sig=abc failed; key AKIAIOSFODNN7EXAMPLE secret "
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY token FwoGZXIvYXdzEXAMPLESESSIONTOKEN "
        "password=hunter2"
    )
    for secret in ("pw@", "abc", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "FwoGZXIv",
                   "hunter2"):
        assert secret not in text


def test_redact_text_keeps_hex_digests() -> None:
    etag = "0123456789abcdef0123456789abcdef01234567"
    assert etag in redact_text(f"etag {etag} mismatch")


def test_describe_exception() -> None:
    exc = ValueError("bad URL https://h/x?X-Amz-Signature=s3cr3t")
    described = describe_exception(exc)
    assert described.startswith("ValueError: bad URL https://h/x?")
    assert "s3cr3t" not in described
    assert describe_exception(TimeoutError()) == "TimeoutError"


def test_operation_redacts_lazily_once() -> None:
    op = Operation("GET", "https://h/x?sig=s3cr3t")
    assert op._text is None  # nothing parsed until a message needs it
    assert f"{op}: failed" == "GET https://h/x?sig=***: failed"
    assert "s3cr3t" not in repr(op)
