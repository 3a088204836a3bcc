"""Redaction (RELIABILITY 23): secrets never reach logs, error messages, reprs, notes or HTML."""

from __future__ import annotations

import dataclasses
import json
import logging
from urllib.parse import quote

import pytest

from asyncflow import ConfigError, Pipeline, PipelineError, _redact
from asyncflow._redact import (
    MASK,
    describe_exception,
    describe_item,
    format_exception,
    redact,
    redact_logs,
    redact_url,
)

pytestmark = pytest.mark.usefixtures("leak_check")

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
TEMP_KEY_ID = "ASIAY34FZKBOKMUTVV7A"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = (
    "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQDmwNtBPd1ChWvWuHCl1QkKs8g4kCUd2Zl"
    "0mMbP0vRuMQIgVt3ZDIn8Ej1gSxBWBs3mBQfCNsD7HPqzZl3GqpVg7Wgq5gIIcxAAGgw0NjQ5MzQ"
)
SIGNATURE = "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"
SECRETS = (KEY_ID, TEMP_KEY_ID, SECRET_KEY, SESSION_TOKEN[:40], SIGNATURE, "hunter2",
           "s3cr3tBearerT0ken")

PRESIGNED = (
    "https://bucket.s3.amazonaws.com/train/0001.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    f"&X-Amz-Credential={KEY_ID}%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
    f"&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token={SESSION_TOKEN}"
    f"&X-Amz-SignedHeaders=host&X-Amz-Signature={SIGNATURE}"
)

#: Exception texts as botocore, aiohttp and users' own code put secrets into them.
LEAKY_MESSAGES = [
    f"GET {PRESIGNED}: 403 Forbidden",
    f"aws_access_key_id={KEY_ID} aws_secret_access_key={SECRET_KEY}",
    f"{{'aws_secret_access_key': '{SECRET_KEY}', 'aws_session_token': '{SESSION_TOKEN}'}}",
    f"credentials {TEMP_KEY_ID} / {SECRET_KEY} were refused",
    f"token {SESSION_TOKEN} expired",
    f"X-Amz-Security-Token: {SESSION_TOKEN}",
    f"Authorization: AWS4-HMAC-SHA256 Credential={KEY_ID}/20240101/us-east-1/s3/aws4_request, "
    f"SignedHeaders=host;x-amz-date, Signature={SIGNATURE}",
    "Authorization: Bearer s3cr3tBearerT0ken",
    "headers={'Authorization': 'Basic dXNlcjpodW50ZXIy'} rejected",
    "cannot connect to https://alice:hunter2@example.com:8443/data?sig=1",
    "password=hunter2 for user alice",
    # botocore, of a presigned query pasted after s3://: the key percent-encoded in a path
    'Could not connect to the endpoint URL: "http://127.0.0.1:9000/bucket/0001.jpg%3F'
    f'{quote(PRESIGNED.partition("?")[2])}"',
]
#: Tails of secrets: what a repr cut in its middle would show of them.
FRAGMENTS = (SIGNATURE[-16:], SESSION_TOKEN[-16:], KEY_ID[-12:])


def _clean(text: str) -> bool:
    return not any(secret in text for secret in (*SECRETS, "dXNlcjpodW50ZXIy"))


@pytest.mark.parametrize("message", LEAKY_MESSAGES)
def test_redact_masks_every_kind_of_secret(message: str) -> None:
    shown = redact(message)
    assert _clean(shown), shown
    assert MASK in shown
    assert redact(shown) == shown  # idempotent: a message redacted twice reads the same


def test_redact_keeps_what_names_the_failure() -> None:
    shown = redact(f"GET {PRESIGNED}: 403 Forbidden")
    assert shown.startswith("GET https://bucket.s3.amazonaws.com/train/0001.jpg?")
    assert "X-Amz-Signature=***" in shown and shown.endswith(": 403 Forbidden")
    # Hex digests (ETags, SHA-1s), paths and plain words survive.
    etag = "0123456789abcdef0123456789abcdef01234567"
    path = "/data/ImageNet/train/n01440764/n01440764_10026.JPEG"
    assert redact(f"etag {etag} of {path} mismatch") == f"etag {etag} of {path} mismatch"
    assert redact("s3://bucket/odd?key.jpg not found") == "s3://bucket/odd?key.jpg not found"


def test_a_raw_secret_access_key_is_masked_even_without_its_name() -> None:
    # Decided: a 40-character base64 word mixing cases and digits is a secret key wherever
    # it appears; a hex digest of the same length is not.
    assert redact(f"key {SECRET_KEY} refused") == "key *** refused"


def test_secrets_from_the_environment_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "short-but-real-secret")
    assert "short-but-real-secret" not in redact("signing with short-but-real-secret failed")


def test_the_sources_use_the_same_redactor() -> None:
    from asyncflow.sources import _http, _http_session, _read, _s3, _transport

    for module in (_http, _http_session, _read, _s3, _transport):
        assert module.redact_url is redact_url, module.__name__
    assert _s3.describe_exception is describe_exception
    assert _http_session.describe_exception is describe_exception


def test_describe_and_format_exception_are_redacted() -> None:
    try:
        raise ValueError(f"aws_secret_access_key={SECRET_KEY}")
    except ValueError as exc:
        assert describe_exception(exc) == "ValueError: aws_secret_access_key=***"
        text = format_exception(exc)
    assert "Traceback" in text and _clean(text)


class _Leaky(Exception):
    pass


def _raise_leaky(message: str) -> object:
    def fail(x: object) -> object:
        raise _Leaky(message)

    return fail


@pytest.mark.parametrize("message", LEAKY_MESSAGES)
def test_a_stage_error_with_secrets_is_redacted_in_what_asyncflow_shows(
    message: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncflow")
    pipe = Pipeline([PRESIGNED]).map(_raise_leaky(message), name="fetch")
    with pytest.raises(PipelineError) as info:
        list(pipe)
    error = info.value
    shown = [str(error), repr(error), *error.exceptions[0].__notes__, caplog.text,
             pipe.stats()._repr_html_(), str(pipe.stats())]
    for text in shown:
        assert _clean(text), text
    assert "fetch" in str(error)


def test_skipped_failures_with_secrets_are_redacted_in_logs_and_display(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncflow")
    items = [f"https://alice:hunter2@example.com/{i}.jpg?X-Amz-Signature={SIGNATURE}"
             for i in range(4)]
    pipe = Pipeline(items).map(_raise_leaky(LEAKY_MESSAGES[1]), max_failures=3)
    with pytest.raises(PipelineError):
        list(pipe)
    assert "skipped item" in caplog.text
    for text in (caplog.text, str(pipe.stats()), pipe.stats()._repr_html_()):
        assert _clean(text), text


def test_stats_failure_records_hold_no_secret() -> None:
    pipe = Pipeline([1, 2]).map(_raise_leaky(LEAKY_MESSAGES[1]), max_failures=1)
    with pytest.raises(PipelineError):
        list(pipe)
    assert all(_clean(f.message) and _clean(f.item) for f in pipe.stats().failures)



@pytest.mark.parametrize(
    "prose",
    ["Basic authentication failed", "Bearer token expired", "its signature is (x, y)",
     "NoCredentialsError: Unable to locate credentials", "max_tokens=5 is too small"],
)
def test_prose_that_names_a_secret_is_left_alone(prose: str) -> None:
    assert redact(prose) == prose


def test_every_secret_name_holds_a_hint_the_fast_path_looks_for() -> None:
    # Text with no hint skips the pair patterns: a name without one would never be masked.
    for name in _redact._SECRET_NAMES.split("|"):
        assert any(hint in name for hint in _redact._NAME_HINTS), name


@dataclasses.dataclass
class _Sample:
    label: int
    url: str


@pytest.mark.parametrize("item", [
    PRESIGNED, ("x" * 50 + PRESIGNED, 7), {"url": PRESIGNED}, _Sample(3, PRESIGNED),
    f"https://alice:hunter2@{'h' * 100}.com/a.jpg",
])
def test_a_shortened_item_shows_no_tail_of_a_secret(item: object) -> None:
    # reprlib keeps a long text's head and tail: cut before it was redacted, the tail held
    # the signature without the name that marks it as one.
    shown = describe_item(item)
    assert len(shown) < 400 and _clean(shown), shown
    assert not any(fragment in shown for fragment in FRAGMENTS), shown


def test_a_state_names_no_secret_of_its_listing() -> None:
    items = [f"https://alice:hunter2@example.com/{i}.jpg?X-Amz-Signature={SIGNATURE}"
             for i in range(3)]
    state = Pipeline(items).state_dict()
    text = json.dumps(state)
    assert _clean(text) and "example.com/0.jpg" in text, text
    other = Pipeline([f"https://alice:hunter2@example.com/9.jpg?sig={SIGNATURE}", *items[1:]])
    with pytest.raises(ConfigError, match="differs from item 0") as info:
        other.load_state_dict(state)
    assert _clean(str(info.value)), info.value


def _raise_encoded(x: object) -> object:
    raise _Leaky(LEAKY_MESSAGES[-1])


def test_a_worker_process_traceback_is_redacted() -> None:
    pipe = Pipeline([PRESIGNED]).map(_raise_encoded, workers="processes")
    with pytest.raises(PipelineError) as info:
        list(pipe)
    [error] = info.value.exceptions
    notes = "\n".join(error.__notes__)
    assert "Traceback" in notes and "_raise_encoded" in notes  # the worker's own traceback
    for text in (notes, str(info.value), repr(info.value), str(pipe.stats())):
        assert _clean(text) and not any(f in text for f in FRAGMENTS), text


def test_redact_logs_masks_a_librarys_records_once_filtered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A library's logger made before the call and one named in it (made on demand) are both
    # filtered; a second call adds no second filter; text with no secret is left as logged.
    early = logging.getLogger("asyncflow_test_lib.endpoint")
    redact_logs("asyncflow_test_lib")
    redact_logs("asyncflow_test_lib")
    late = logging.getLogger("asyncflow_test_lib")
    assert len(early.filters) == 1 and len(late.filters) == 1
    caplog.set_level(logging.DEBUG, logger="asyncflow_test_lib")
    early.debug("headers: %s", {"X-Amz-Security-Token": "FwoGZXIvYXdzEJr//////////wEaDC"})
    late.debug("Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/x")
    early.debug("plain %d", 7)
    assert [r.getMessage() for r in caplog.records] == [
        "headers: {'X-Amz-Security-Token': '***'}", "Authorization: ***", "plain 7"]


@pytest.mark.parametrize("url", [
    "https://user:hunter?2@host/a.jpg",  # a raw "?", "#" or "@" in a pasted password
    "https://user:hunter#2@host/a.jpg",
    "s3://user:hunter@2@bucket/key",
    "http://user:hunter2@host",
])
def test_user_info_is_masked_whatever_its_password_holds(url: str) -> None:
    for text in (redact_url(url), redact(f"GET {url}: 503")):
        assert "hunter" not in text and "user" not in text, text
        assert "host" in text or "bucket" in text, text
