"""Redaction: credentials, query values, AWS keys never reach a message."""

from __future__ import annotations

import pytest

import asyncflow
from asyncflow import SourceError
from asyncflow._redact import Operation, describe_exception, redact, redact_url


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
        ("s3://bucket/odd?key#with%chars", "s3://bucket/odd?key#with%chars"),
        # a presigned query pasted after s3://: the key stays, its credentials do not
        ("s3://bucket/k.jpg?X-Amz-Signature=abc&X-Amz-Credential=AKIA/x&X-Amz-Expires=60",
         "s3://bucket/k.jpg?X-Amz-Signature=***&X-Amz-Credential=***&X-Amz-Expires=60"),
        ("s3://b/k?AWSAccessKeyId=AKIAX&Expires=1&Signature=a%2Bb",
         "s3://b/k?AWSAccessKeyId=***&Expires=1&Signature=***"),
        ("s3://b/sas?sv=2020-08-04&sig=abc%2Bdef", "s3://b/sas?sv=2020-08-04&sig=***"),
        # the same key as botocore puts it in the endpoint's path: percent-encoded
        ("http://h:9/b/k%3FX-Amz-Signature%3Dabc%26v%3D1",
         "http://h:9/b/k%3FX-Amz-Signature%3D***%26v%3D1"),
        ("http://h/b/k%253Fsig%253Dabc%2526v", "http://h/b/k%253Fsig%253D***%2526v"),
        ("/data/train/0001.jpg", "/data/train/0001.jpg"),
        ("http://u:p@[::1/x?sig=1", "http://[::1/x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_masks_urls_keys_and_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLESESSIONTOKEN")
    text = redact(
        "GET https://u:pw@h/x?sig=abc failed; key AKIAIOSFODNN7EXAMPLE secret "
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY token FwoGZXIvYXdzEXAMPLESESSIONTOKEN "
        "password=hunter2"
    )
    for secret in ("pw@", "abc", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "FwoGZXIv",
                   "hunter2"):
        assert secret not in text


def test_redact_text_keeps_hex_digests() -> None:
    etag = "0123456789abcdef0123456789abcdef01234567"
    assert etag in redact(f"etag {etag} mismatch")


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


@pytest.mark.parametrize("url", ["file://alice:hunter2@nas/data/x.jpg?sig=s3cr3t",
                                 "file://alice:hunter2@?sig=s3cr3t"])
async def test_a_file_url_it_refuses_is_named_redacted(url: str) -> None:
    with pytest.raises(SourceError) as info:
        await asyncflow.read_bytes(url)
    assert str(info.value).startswith("file://***@")
    assert "hunter2" not in str(info.value) and "s3cr3t" not in str(info.value)
