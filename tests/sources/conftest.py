"""Fixtures for the source tests: a fault-injecting HTTP server and moto's S3, on loopback.

The servers start once per test session (before any test's leak baseline is taken), so a
test's leak check sees only what the test itself left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from asyncflow.sources import _http_session
from tests.servers import FaultServer, S3Server, fault_server, moto_server

_names = itertools.count()


@pytest.fixture(scope="session")
def http_server() -> Iterator[FaultServer]:
    """The fault server (see ``tests/servers.py``) on 127.0.0.1, on its own thread."""
    with fault_server() as server:
        yield server


@pytest.fixture
def unique() -> str:
    """A name no other test uses: fault counters are per exact path, so tests never share."""
    return f"t{os.getpid()}-{next(_names)}"


@pytest.fixture
async def warm_executor() -> None:
    """Start the test loop's default thread pool before a leak baseline is taken.

    aiobotocore builds its TLS context on that pool (``asyncio.to_thread``) when a client is
    created, and aiofiles reads files there. Its threads belong to the loop and end when the
    loop closes; request this fixture before ``async_leak_check`` so they are not counted as
    left behind. The pool may start a new thread whenever a job arrives before the last one's
    thread has marked itself idle, so all of its threads are started here, at once.
    """
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: None)
    size = getattr(getattr(loop, "_default_executor", None), "_max_workers", None)
    size = size or min(32, (os.cpu_count() or 1) + 4)
    barrier = threading.Barrier(size)
    await asyncio.gather(*(loop.run_in_executor(None, barrier.wait, 10) for _ in range(size)))


@pytest.fixture(scope="session")
def moto() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (a free port), for the whole session."""
    pytest.importorskip("aiobotocore")
    pytest.importorskip("moto.server")
    with moto_server() as server:
        yield server


@pytest.fixture
def aws_env(moto: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Point the standard AWS chain (fake keys, region, ``AWS_ENDPOINT_URL``) at moto."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in moto.env().items():
        monkeypatch.setenv(name, value)
    return moto


@pytest.fixture
async def s3(aws_env: S3Server) -> AsyncIterator[Any]:
    """A raw aiobotocore client on moto, for setting up buckets and objects."""
    from aiobotocore.session import get_session

    async with get_session().create_client("s3") as client:
        yield client


@pytest.fixture
async def bucket(s3: Any, unique: str) -> str:
    """A fresh, empty bucket; its name."""
    name = f"bkt-{unique}".lower().replace("_", "-")
    await s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def count_sessions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record each aiohttp session asyncflow opens."""
    opened: list[Any] = []
    real = _http_session.new_session

    def counting(*args: Any, **kwargs: Any) -> Any:
        session = real(*args, **kwargs)
        opened.append(session)
        return session

    monkeypatch.setattr(_http_session, "new_session", counting)
    return opened
