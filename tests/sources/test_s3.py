"""S3 through aiobotocore against real servers on 127.0.0.1: moto's S3, and the fault server
standing in for a throttling S3 endpoint."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow import (
    Pipeline,
    PipelineError,
    Retry,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    sources,
)
from asyncflow.sources import _s3
from tests.servers import FaultServer, S3Server, generated, moto_set_auth

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")

FAST = Retry(attempts=4, backoff=0.01, max_backoff=0.05)


async def put_many(s3: Any, bucket: str, keys: list[str], body: bytes = b"x") -> None:
    limit = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with limit:
            await s3.put_object(Bucket=bucket, Key=key, Body=body + key.encode())

    await asyncio.gather(*(put(k) for k in keys))


@pytest.fixture
def count_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    made: list[Any] = []
    real = _s3._new_client

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_s3, "_new_client", counting)
    return made


async def test_reads_objects_through_the_standard_chain(s3: Any, bucket: str) -> None:
    await s3.put_object(Bucket=bucket, Key="a/b.bin", Body=b"hello")
    await s3.put_object(Bucket=bucket, Key="odd?key#with%chars", Body=b"odd")
    assert await asyncflow.read_bytes(f"s3://{bucket}/a/b.bin") == b"hello"
    assert await asyncflow.read_bytes(f"s3://{bucket}/odd?key#with%chars") == b"odd"


async def test_max_bytes_and_the_url_the_bytes_carry(s3: Any, bucket: str) -> None:
    # issue 25.6 / 25.11: an object over max_bytes is refused; the bytes name their object
    await s3.put_object(Bucket=bucket, Key="big.bin", Body=b"z" * 300_000)
    url = f"s3://{bucket}/big.bin"
    data = await asyncflow.read_bytes(url, max_bytes=300_000)
    assert data == b"z" * 300_000 and data.url == url
    with pytest.raises(SourceError, match=rf"{url}: more than .*over max_bytes=299,999"):
        await asyncflow.read_bytes(url, max_bytes=299_999)
    listed = [i async for i in sources.list_objects(url, detail=True)]
    with pytest.raises(SourceError, match=r"\(listed\), over max_bytes=1,000"):
        await asyncflow.read_bytes(listed[0], max_bytes=1000)


async def test_endpoint_from_argument_or_service_variable(
    s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, aws_env: S3Server
) -> None:
    await s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    url = f"s3://{bucket}/k"
    assert await asyncflow.read_bytes(url, endpoint_url=aws_env.endpoint_url) == b"v"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env.endpoint_url)
    assert await asyncflow.read_bytes(url) == b"v"


async def test_missing_key_and_bucket_fail_at_once(s3: Any, bucket: str) -> None:
    with pytest.raises(SourceNotFound) as info:
        await asyncflow.read_bytes(f"s3://{bucket}/nope.jpg", retry=FAST)
    assert str(info.value) == (
        f"GET s3://{bucket}/nope.jpg: NoSuchKey (HTTP 404) (1 attempt; not retryable)"
    )
    with pytest.raises(SourceNotFound, match="NoSuchBucket"):
        await asyncflow.read_bytes(f"s3://{bucket}-missing/x", retry=FAST)
    with pytest.raises(SourceError, match="no bucket"):
        await asyncflow.read_bytes("s3:///key")


@pytest.mark.slow
async def test_lists_more_than_a_thousand_keys(
    s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"train/{i:05d}.bin" for i in range(1100)]
    await put_many(s3, bucket, [*keys, "val/0.bin"])
    await s3.put_object(Bucket=bucket, Key="train/", Body=b"")  # a folder marker
    pages = 0
    real = _s3.list_page

    async def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal pages
        pages += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(_s3, "list_page", counting)
    listed = [url async for url in sources.list_objects(f"s3://{bucket}/train/")]
    assert listed == [f"s3://{bucket}/{k}" for k in keys]
    assert pages == 2  # S3 pages hold at most 1,000 keys
    infos = [i async for i in sources.list_objects(f"s3://{bucket}/train/0109", detail=True)]
    assert [i.url for i in infos] == [f"s3://{bucket}/train/{n:05d}.bin" for n in range(1090, 1100)]
    assert all(i.size == len(b"x" + k.encode()) and i.etag for i, k in zip(infos, keys[1090:],
                                                                          strict=True))
    assert await asyncflow.read_bytes(infos[0]) == b"x" + keys[1090].encode()


async def test_a_prefix_that_lists_nothing_is_an_error(s3: Any, bucket: str) -> None:
    # issue 25.12: a typo in a prefix once gave an epoch of 0 batches, and no error
    await put_many(s3, bucket, ["train/0.bin", "train/1.bin"])
    with pytest.raises(SourceNotFound, match=rf"s3://{bucket}/trian/: nothing is listed") as info:
        async for _ in sources.list_objects(f"s3://{bucket}/trian/"):
            pass
    assert "allow_empty=True" in str(info.value)
    pipe = Pipeline(sources.list_objects(f"s3://{bucket}/Train/")).map(asyncflow.read_bytes)
    with pytest.raises(PipelineError) as failed:  # not an epoch of 0 batches
        async for _ in pipe:
            pass
    assert isinstance(failed.value.exceptions[0], SourceNotFound)
    assert [u async for u in sources.list_objects(f"s3://{bucket}/x/", allow_empty=True)] == []
    assert len([u async for u in sources.list_objects(f"s3://{bucket}/train/")]) == 2


class _Pages:
    """A store's ListObjectsV2 that says each page is truncated, with ``token`` as the next."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    async def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]:
        page = {"Contents": [{"Key": "a/0.bin", "Size": 1}], "IsTruncated": True}
        return page if self.token is None else {**page, "NextContinuationToken": self.token}


@pytest.mark.parametrize(("token", "given"), [(None, None), ("t1", "t1")])
async def test_a_truncated_page_without_a_new_token_is_an_error(
    token: str | None, given: str | None
) -> None:
    # No token: the listing ended quietly after its first page (the rest lost, uncounted);
    # the same token again: the same page was listed forever.
    with pytest.raises(SourceError, match=r"LIST s3://b/a/: .* no new continuation token"):
        await _s3.list_page(_Pages(token), "b", "a/", given, what="LIST s3://b/a/", retry=FAST)
    assert await _s3.list_page(_Pages("t2"), "b", "a/", "t1", what="x", retry=FAST) == (
        [{"Key": "a/0.bin", "Size": 1}], "t2")


async def test_listing_a_missing_bucket(aws_env: S3Server) -> None:
    with pytest.raises(SourceNotFound, match="NoSuchBucket"):
        async for _ in sources.list_objects("s3://no-such-bucket-here/"):
            pass


async def test_pipeline_shares_one_client_and_closes_it(
    s3: Any, bucket: str, count_clients: list[Any]
) -> None:
    keys = [f"p/{i:03d}" for i in range(60)]
    await put_many(s3, bucket, keys, body=b"data-")
    pipe = (Pipeline(sources.list_objects(f"s3://{bucket}/p/"), retry=FAST)
            .map(asyncflow.read_bytes, concurrency=16, ordered=True))
    got = [body async for body in pipe]
    assert got == [b"data-" + k.encode() for k in keys]
    assert len(count_clients) == 1  # the listing and all 60 reads shared one client


# -- throttling and broken bodies, from a fault server posing as the S3 endpoint ------------


async def test_slowdown_is_retried(
    http_server: FaultServer, unique: str, aws_env: S3Server
) -> None:
    path = f"/gen/2000/{unique}"
    faults = "fail=2,status=503,code=SlowDown"
    url = f"s3://f/{faults}{path}"
    body = await asyncflow.read_bytes(url, endpoint_url=http_server.base, retry=FAST)
    assert body == generated(path, 2000)
    assert http_server.hits(f"/f/{faults}{path}") == 3


async def test_slowdown_forever_names_code_and_attempts(
    http_server: FaultServer, unique: str, aws_env: S3Server
) -> None:
    url = f"s3://f/fail=9999,status=503,code=SlowDown/gen/10/{unique}"
    with pytest.raises(SourceError) as info:
        async with asyncio.timeout(10):
            await asyncflow.read_bytes(url, endpoint_url=http_server.base,
                                       retry=Retry(attempts=3, backoff=0.01, patience=0.5))
    hits = http_server.hits(f"/f/fail=9999,status=503,code=SlowDown/gen/10/{unique}")
    assert hits > 3  # throttling never uses up attempts
    assert str(info.value) == (
        f"GET {url}: SlowDown (HTTP 503) (gave up after {hits} attempts; throttled, nothing "
        "from this host succeeded for 0.5s)"
    )


async def test_internal_error_forever_uses_up_attempts(
    http_server: FaultServer, unique: str, aws_env: S3Server
) -> None:
    url = f"s3://f/fail=99,status=500,code=InternalError/gen/10/{unique}"
    with pytest.raises(SourceError) as info:
        await asyncflow.read_bytes(url, endpoint_url=http_server.base,
                                   retry=Retry(attempts=3, backoff=0))
    assert str(info.value) == f"GET {url}: InternalError (HTTP 500) (gave up after 3 attempts)"


@pytest.mark.parametrize("fault", ["truncate=1", "reset=1", "fail=1,status=500,code=InternalError"])
async def test_broken_responses_are_retried(
    http_server: FaultServer, unique: str, aws_env: S3Server, fault: str
) -> None:
    path = f"/gen/40000/{unique}"
    body = await asyncflow.read_bytes(f"s3://f/{fault}{path}", endpoint_url=http_server.base,
                                      retry=FAST)
    assert body == generated(path, 40000)
    assert http_server.hits(f"/f/{fault}{path}") == 2


async def test_access_denied_fails_at_once(
    http_server: FaultServer, unique: str, aws_env: S3Server
) -> None:
    url = f"s3://f/fail=9,status=403,code=AccessDenied/gen/10/{unique}"
    with pytest.raises(SourcePermissionError, match=r"AccessDenied \(HTTP 403\) \(1 attempt"):
        await asyncflow.read_bytes(url, endpoint_url=http_server.base, retry=FAST)


# -- credentials checked for real: moto with IAM authentication on ---------------------------


@pytest.fixture
async def iam_user(s3: Any, bucket: str, aws_env: S3Server) -> AsyncIterator[dict[str, str]]:
    """An IAM user allowed to read ``bucket``; moto checks every signature while it lives."""
    from aiobotocore.session import get_session

    await s3.put_object(Bucket=bucket, Key="secret.bin", Body=b"classified")
    async with get_session().create_client("iam") as iam:
        name = f"reader-{bucket}"
        await iam.create_user(UserName=name)
        await iam.put_user_policy(
            UserName=name, PolicyName="read",
            PolicyDocument='{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
                           '"Action": "s3:*", "Resource": "*"}]}',
        )
        key = (await iam.create_access_key(UserName=name))["AccessKey"]
    moto_set_auth(aws_env.endpoint_url, 0)
    try:
        yield {"id": key["AccessKeyId"], "secret": key["SecretAccessKey"], "bucket": bucket}
    finally:
        moto_set_auth(aws_env.endpoint_url, float("inf"))


@pytest.fixture
def auth_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def use(key_id: str, secret: str) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)

    yield use


async def test_wrong_credentials_fail_at_once_without_leaking_them(
    iam_user: dict[str, str], auth_env: Any
) -> None:
    url = f"s3://{iam_user['bucket']}/secret.bin"
    auth_env(iam_user["id"], iam_user["secret"])
    assert await asyncflow.read_bytes(url) == b"classified"

    auth_env("AKIAWRONGWRONGWRONG1", "wrongSecretKey/ForTests1234567890abcdEFGH")
    with pytest.raises(SourcePermissionError, match="InvalidAccessKeyId") as info:
        await asyncflow.read_bytes(url, retry=FAST)
    auth_env(iam_user["id"], "WrongSecretButRealKeyId/1234567890abcdEFGH")
    with pytest.raises(SourcePermissionError, match="SignatureDoesNotMatch") as info2:
        await asyncflow.read_bytes(url, retry=FAST)
    with pytest.raises(SourcePermissionError):
        async for _ in sources.list_objects(f"s3://{iam_user['bucket']}/", retry=FAST):
            pass
    for exc in (info.value, info2.value):
        seen = "".join(traceback.format_exception(exc)) + repr(exc)
        for secret in ("wrongSecretKey", "WrongSecretButRealKeyId", iam_user["secret"]):
            assert secret not in seen


async def test_no_credentials_at_all(
    aws_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SourcePermissionError, match="no usable AWS credentials"):
        await asyncflow.read_bytes("s3://any-bucket/key")


async def test_slowdown_retry_after_is_honoured(
    http_server: FaultServer, unique: str, aws_env: S3Server
) -> None:
    url = f"s3://f/fail=1,status=503,code=SlowDown,retry_after=1/gen/10/{unique}"
    start = asyncio.get_running_loop().time()
    await asyncflow.read_bytes(url, endpoint_url=http_server.base, retry=FAST)
    assert asyncio.get_running_loop().time() - start >= 1.0


async def test_timeouts_without_limits(s3: Any, bucket: str) -> None:
    await s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    unlimited = asyncflow.Timeout(connect=None, read=None, total=None)
    assert await asyncflow.read_bytes(f"s3://{bucket}/k", timeout=unlimited) == b"v"


async def _collect(gen: Any) -> bytes:
    out = b""
    async for chunk in gen:
        out += chunk
    return out


async def test_a_resumed_stream_proves_it_reads_the_same_object(s3: Any, bucket: str) -> None:
    await s3.put_object(Bucket=bucket, Key="shard.tar", Body=b"a" * 1000 + b"b" * 1000)
    url = f"s3://{bucket}/shard.tar"
    retry = asyncflow.Retry(attempts=1)
    async with _s3.s3_client(None, asyncflow.Timeout()) as client:
        resume = _s3.S3Resume()
        first = await _collect(_s3.stream(client, url, 0, what=url, retry=retry, resume=resume))
        assert resume.etag and resume.total == 2000 and len(first) == 2000
        # resumed at byte 1500 of the same object: the rest, checked against the first answer
        rest = await _collect(_s3.stream(client, url, 1500, what=url, retry=retry,
                                         resume=resume))
        assert rest == b"b" * 500
        # the object is replaced between tries: a resumed read refuses to splice
        await s3.put_object(Bucket=bucket, Key="shard.tar", Body=b"c" * 2000)
        with pytest.raises(asyncflow.SourceError, match="changed"):
            await _collect(_s3.stream(client, url, 1500, what=url, retry=retry, resume=resume))
    # no ETag in the first answer: refused before any request (no client to send one)
    with pytest.raises(asyncflow.SourceError, match="had no ETag"):
        await _collect(_s3.stream(None, url, 1500, what=url, retry=retry, resume=_s3.S3Resume()))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("url", ["s3://AKIAEXAMPLE:hunter2-secret@bucket/k.bin",
                                 "s3://hunter2-secret@bucket/k.bin"])
async def test_credentials_in_an_s3_url_are_refused_without_showing_them(url: str) -> None:
    # botocore refused the bucket "AKIAEXAMPLE:hunter2-secret@bucket" and printed it whole.
    for read in (lambda: asyncflow.read_bytes(url, retry=FAST),
                 lambda: anext(sources.list_objects(url))):
        with pytest.raises(SourceError, match=r"s3://\*\*\*@bucket/k.bin: .*no credentials") as got:
            await read()
        assert "hunter2" not in "".join(traceback.format_exception(got.value))
