"""A read that has to be retried says so at WARNING the first time (issue 25.12: a stalled
HTTP body once gave 151 s of silence, its retries logged only at DEBUG)."""

from __future__ import annotations

import logging

import pytest

import asyncflow
from asyncflow import Retry, SourceTimeout, Timeout
from tests.servers import FaultServer

pytestmark = pytest.mark.usefixtures("async_leak_check")


async def test_the_first_retry_of_a_stalled_read_is_a_warning(
    http_server: FaultServer, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = http_server.url(f"/gen/20000/{unique}?stall=5&token=secret")
    with caplog.at_level(logging.DEBUG, logger="asyncflow.sources"), \
            pytest.raises(SourceTimeout):
        await asyncflow.read_bytes(url, retry=Retry(attempts=3, backoff=0),
                                   timeout=Timeout(read=0.2))
    retries = [r for r in caplog.records if "; try " in r.getMessage()]
    assert [r.levelname for r in retries] == ["WARNING", "DEBUG"]
    warning = retries[0].getMessage()
    assert f"GET {http_server.base}/gen/20000/{unique}?stall=***&token=***" in warning
    assert "try 2 of 3" in warning and "secret" not in warning
