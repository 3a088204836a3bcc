"""A presigned query pasted after ``s3://`` (RELIABILITY 23): the key is read as it is, and its
credential values reach no message, log, note or repr, nor botocore's text that asyncflow
passes on (where the key is percent-encoded in the endpoint's URL)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow import Pipeline, PipelineError, Retry, SourceError, SourceNotFound, sources
from tests.servers import S3Server

from .test_http import everything_about

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")

FAST = Retry(attempts=2, backoff=0.01, max_backoff=0.05)
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SIGNATURE = "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"
TOKEN = "IQoJb3JpZ2luX2VjEJr0wEaCXVzLWVhc3QtMSJHMEUCIQDmwNtBPd1ChWvWuHCl1QkKs8g4kCUd2Zl"
SECRETS = (KEY_ID, SIGNATURE, TOKEN, "20240101%2F", "20240101/us-east-1")
QUERY = (f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={KEY_ID}/20240101/us-east-1/s3/"
         f"aws4_request&X-Amz-Security-Token={TOKEN}&X-Amz-Signature={SIGNATURE}")
SHOWN = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Security-Token=***"
         "&X-Amz-Signature=***")


def _clean(text: str) -> bool:
    return not any(secret in text for secret in SECRETS)


@pytest.fixture
def refusing_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that refuses every connection (a port bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_presigned_query_in_a_key_is_masked_in_errors_and_reprs(
    s3: Any, bucket: str
) -> None:
    url = f"s3://{bucket}/train/0001.jpg?{QUERY}"
    with pytest.raises(SourceNotFound) as info:
        await asyncflow.read_bytes(url, retry=FAST)
    assert str(info.value) == (f"GET s3://{bucket}/train/0001.jpg?{SHOWN}: NoSuchKey (HTTP 404) "
                               "(1 attempt; not retryable)")
    assert _clean(everything_about(info.value))
    with pytest.raises(SourceNotFound) as streamed:  # the stream's own message
        async for _ in sources.tar_samples(url, retry=FAST):
            pass
    assert f"0001.jpg?{SHOWN}" in str(streamed.value) and _clean(everything_about(streamed.value))
    with pytest.raises(SourceNotFound) as listed:
        async for _ in sources.list_objects(url, retry=FAST):
            pass
    assert _clean(everything_about(listed.value))
    # An object whose key holds such a query is read, and its repr and record stay clean.
    await s3.put_object(Bucket=bucket, Key=f"odd.bin?{QUERY}", Body=b"odd")
    blob = await asyncflow.read_bytes(f"s3://{bucket}/odd.bin?{QUERY}")
    assert blob == b"odd" and blob.url == f"s3://{bucket}/odd.bin?{QUERY}"
    [info_] = [i async for i in sources.list_objects(f"s3://{bucket}/odd", detail=True)]
    for text in (repr(blob), repr(info_)):
        assert f"odd.bin?{SHOWN}" in text and _clean(text), text


async def test_an_ordinary_key_with_a_question_mark_reads_whole(s3: Any, bucket: str) -> None:
    url = f"s3://{bucket}/a?version=2&size=large.jpg"
    with pytest.raises(SourceNotFound) as info:
        await asyncflow.read_bytes(url, retry=FAST)
    assert str(info.value).startswith(f"GET {url}: NoSuchKey")


async def test_botocores_percent_encoded_key_is_masked_in_errors_and_logs(
    aws_env: S3Server, refusing_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    # botocore's "Could not connect to the endpoint URL: "http://.../k%3FX-Amz-Signature%3D..."
    caplog.set_level(logging.DEBUG, logger="asyncflow")
    url = f"s3://bucket/k.jpg?{QUERY}"
    with pytest.raises(SourceError, match="EndpointConnectionError") as info:
        await asyncflow.read_bytes(url, retry=FAST, endpoint_url=refusing_endpoint)
    shown = everything_about(info.value)
    assert "k.jpg%3FX-Amz-Algorithm%3DAWS4-HMAC-SHA256%26X-Amz-Credential%3D***%26" in shown
    assert "try 2 of 2" in caplog.text  # the retry was logged ...
    assert _clean(shown) and _clean(caplog.text), shown  # ... without a secret


async def test_a_pipeline_over_such_keys_keeps_notes_and_records_clean(
    s3: Any, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncflow")
    # The key's first segment (the S3 window's prefix, named in stats().notes) holds the
    # credential: "X-Amz-Credential=AKIA.../" ends at its first "/".
    urls = [f"s3://{bucket}/k{i}.jpg?{QUERY}" for i in range(3)]
    pipe = Pipeline(urls, retry=FAST).map(asyncflow.read_bytes, max_failures=2)
    with pytest.raises(PipelineError) as info:
        async for _ in pipe:
            pass
    stats = pipe.stats()
    assert any("remote reads from" in note for note in stats.notes)
    seen = [*stats.notes, *(f.item + f.message for f in stats.failures), str(stats),
            stats._repr_html_(), caplog.text, everything_about(info.value)]
    for text in seen:
        assert _clean(text), text


SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
LONG_TOKEN = TOKEN * 3  # a session token, as STS gives one: hundreds of characters
READ_WITH_DEBUG_LOGS = """
import asyncio, logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
import asyncflow
blob = asyncio.run(asyncflow.read_bytes(sys.argv[1]))
assert blob == b"logged", blob
"""


async def test_botocores_debug_logs_hold_no_credentials(
    s3: Any, bucket: str, aws_env: S3Server
) -> None:
    # botocore logs each request's headers (the session token, the key id in Authorization)
    # and its signature at DEBUG. A fresh interpreter, as a user's script: every record that
    # reaches the root's handler passes asyncflow's redacting filter on botocore's loggers.
    await s3.put_object(Bucket=bucket, Key="logged.bin", Body=b"logged")
    env = {**os.environ, **aws_env.env(), "AWS_ACCESS_KEY_ID": KEY_ID,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_SESSION_TOKEN": LONG_TOKEN}
    done = subprocess.run([sys.executable, "-c", READ_WITH_DEBUG_LOGS,
                           f"s3://{bucket}/logged.bin"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = done.stderr
    assert "botocore.endpoint" in logged and "botocore.auth" in logged  # the records are there
    assert "X-Amz-Security-Token" in logged and "Signature" in logged
    for secret in (KEY_ID, SECRET_KEY, TOKEN[:40]):
        assert secret not in logged
    # The signature, as botocore.auth prints it and in the Authorization header it sends:
    assert "Signature:\n***" in logged and "Signature=***" in logged
