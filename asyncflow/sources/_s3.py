"""S3 (and S3-compatible stores) through one shared aiobotocore client.

Credentials and region come from the standard AWS chain (environment, shared files, instance
roles). The endpoint is ``endpoint_url=`` when given, else whatever botocore configures from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` or the config file. botocore's own retries are
off: :mod:`._retry` retries every call, so that one policy (and one attempt count in the
final error) covers HTTP and S3 alike. :class:`S3Transport` is the ``s3`` scheme's transport.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from .._errors import SourceError, SourcePermissionError
from .._redact import Operation, describe_exception, redact_logs, redact_url
from ._limiter import limiter_for
from ._objects import ObjectInfo, connections, shared
from ._retry import Retry, Timeout, Transient, failed_answer
from ._tries import Changed, retry_stream, retry_whole, with_retries

__all__ = ["S3Transport", "list_page", "s3_client", "split_s3_url", "stream"]

_CHUNK = 256 * 1024
_NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
_DENIED = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "InvalidClientTokenId",
    "UnrecognizedClientException", "AccountProblem", "401", "403",
})
#: "Too many requests": shrinks the prefix's window, never uses up ``Retry.attempts``.
_THROTTLED = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "TooManyRequests", "TooManyRequestsException", "RequestThrottled",
    "ProvisionedThroughputExceededException", "ServiceUnavailable",
    "BandwidthLimitExceeded", "429", "503",
})
_RETRIED = _THROTTLED | {
    "InternalError", "RequestTimeout", "RequestTimeoutException", "500", "502", "504",
}
_TRANSPORT_ERRORS = (
    BotoConnectionError, HTTPClientError, IncompleteReadError, ResponseStreamingError
)
_SDK_ERRORS = (ClientError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError)


def split_s3_url(url: str) -> tuple[str, str]:
    """``("bucket", "key/of/object")`` from ``"s3://bucket/key/of/object"``.

    The key is taken verbatim: S3 keys may hold ``?``, ``#`` and ``%``, so nothing is
    unquoted or cut off. ``url`` is one the ``s3`` transport was given: it starts with
    ``s3://`` (``_transport.transport_for`` routes no other).
    """
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise SourceError(f"{redact_url(url)}: no bucket in the URL")
    if "@" in bucket:
        # s3://KEY:SECRET@bucket (as Hadoop's s3n took): botocore would refuse the bucket
        # name and print it, secret and all.
        raise SourceError(f"{redact_url(url)}: an s3:// URL carries no credentials; give "
                          "them through the environment or the AWS config, as boto does")
    return bucket, key


def _new_client(endpoint_url: str | None, timeout: Timeout) -> AbstractAsyncContextManager[Any]:
    config = AioConfig(
        max_pool_connections=connections(),
        connect_timeout=timeout.connect,
        read_timeout=timeout.read,
        retries={"total_max_attempts": 1, "mode": "standard"},
    )
    redact_logs("botocore", "aiobotocore")  # their DEBUG records hold a request's credentials
    return get_session().create_client("s3", endpoint_url=endpoint_url, config=config)  # type: ignore[no-any-return]


def s3_client(endpoint_url: str | None, timeout: Timeout) -> AbstractAsyncContextManager[Any]:
    """The running pipeline's client for this endpoint, or a private one for the block."""
    key = f"asyncflow.s3|{endpoint_url or ''}|{timeout.connect}|{timeout.read}"
    return shared(key, lambda: _new_client(endpoint_url, timeout))


def _error_code(exc: ClientError) -> tuple[str, int | None]:
    response: Mapping[str, Any] = exc.response or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


def _translate(exc: BaseException, what: object, retry: Retry) -> Exception:
    """The asyncflow error for a botocore / aiohttp failure, free of secrets."""
    if isinstance(exc, ClientError):
        code, status = _error_code(exc)
        label = f"{code} (HTTP {status})" if status else code or "error"
        headers = (exc.response or {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return failed_answer(what, label, status, retry, headers.get("retry-after"),
                             gone=code in _NOT_FOUND, denied=code in _DENIED,
                             retried=code in _RETRIED, throttled=code in _THROTTLED)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return SourcePermissionError(f"{what}: no usable AWS credentials ({type(exc).__name__})")
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
        return Transient(f"timed out ({type(exc).__name__})", timeout=True)
    if isinstance(exc, BotoCoreError) and not isinstance(exc, _TRANSPORT_ERRORS):
        return SourceError(f"{what}: {describe_exception(exc)}")
    return Transient(f"connection failed ({describe_exception(exc)})")


class S3Resume:
    """What the first answer said of an object (its ETag and size), which a resumed read must
    match: a resumed ``GetObject`` carries ``IfMatch``, and its answer's own ETag is checked
    too (some S3-compatible stores ignore ``IfMatch``), so an object replaced between tries
    is never spliced to its old bytes: a stream stops (``Changed``), a whole read starts
    again from byte 0. An object without an ETag is never resumed."""

    __slots__ = ("etag", "total")

    def __init__(self) -> None:
        self.etag: str | None = None
        self.total: int | None = None


def _changed(what: object, etag: str, was: object) -> Changed:
    return Changed(f"{what}: the object changed while it was being read (its ETag "
                       f"{str(was)[:80]} is not {etag[:80]}); a resumed read would splice two "
                       "versions")


def _check_resumed(resp: dict[str, Any], offset: int, resume: S3Resume, what: object) -> None:
    # IfMatch asks the store; a store that ignores it would answer another version's bytes,
    # so the answer's own ETag must prove it too.
    assert resume.etag is not None  # stream() resumes only an object with one
    if resp.get("ETag") != resume.etag:
        raise _changed(what, resume.etag, resp.get("ETag"))
    answered = resp.get("ContentRange")
    want = f"bytes {offset}-{(resume.total or 0) - 1}/{resume.total}"
    if resume.total is not None and answered != want:
        raise SourceError(f"{what}: asked for bytes {offset}- of {resume.total}, the answer "
                          f"holds {answered!r}; refusing to splice it")


async def stream(
    client: Any, url: str, offset: int, *, what: object, retry: Retry, resume: S3Resume
) -> AsyncGenerator[bytes, None]:
    """One try at the object's bytes from ``offset`` on, in chunks (raises ``Transient``).

    Give one ``resume`` record to every try of one read: the first answer fills it in, and a
    resumed try proves it continues the same object (``IfMatch`` on the ETag, the range
    checked).

    Raises:
        SourceError: The object changed since the first try, or answered another range; or
            a resumed try of an object whose first answer had no ETag (nothing could prove
            the range continues the same object).
    """
    bucket, key = split_s3_url(url)
    extra: dict[str, Any] = {}
    if offset:
        if resume.etag is None:
            raise Changed(f"{what}: the first answer had no ETag, so nothing proves a "
                              f"resumed range (from byte {offset}) continues the same object; "
                              "cannot resume")
        extra = {"Range": f"bytes={offset}-", "IfMatch": resume.etag}
    try:
        resp = await client.get_object(Bucket=bucket, Key=key, **extra)
    except ClientError as exc:
        if offset and _error_code(exc)[0] == "InvalidRange":
            return  # resumed exactly at the end: nothing is left
        if offset and _error_code(exc)[0] in ("PreconditionFailed", "412"):
            raise _changed(what, str(resume.etag), "now") from None
        raise _translate(exc, what, retry) from None
    except _SDK_ERRORS as exc:
        raise _translate(exc, what, retry) from None
    expected = resp.get("ContentLength")
    if not offset:
        resume.etag = resp.get("ETag")
        resume.total = expected if isinstance(expected, int) else None
    got = 0
    async with resp["Body"] as body:  # closed (its connection too) however the try ends
        if offset:
            _check_resumed(resp, offset, resume, what)
        try:
            async for chunk in body.iter_chunks(_CHUNK):
                got += len(chunk)
                yield chunk
        except _SDK_ERRORS as exc:
            raise _translate(exc, what, retry) from None
    if isinstance(expected, int) and got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")


def _tries(
    url: str, what: object, retry: Retry, client: Any
) -> Callable[[int], AsyncGenerator[bytes, None]]:
    """One read's tries on ``client``, each from a byte offset, all proving one object."""
    return functools.partial(stream, client, url, what=what, retry=retry, resume=S3Resume())


async def list_page(
    client: Any, bucket: str, prefix: str, token: str | None, *, what: object, retry: Retry
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``ListObjectsV2``: the objects and the next continuation token."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if token:
        kwargs["ContinuationToken"] = token
    try:
        page = await client.list_objects_v2(**kwargs)
    except _SDK_ERRORS as exc:
        raise _translate(exc, what, retry) from None
    if not page.get("IsTruncated"):
        return list(page.get("Contents", [])), None
    following = page.get("NextContinuationToken")
    if not following or following == token:  # the rest would be lost, or this page again
        raise SourceError(f"{what}: the store said the listing goes on, but gave no new "
                          "continuation token; refusing to list only part of it")
    return list(page.get("Contents", [])), following


class S3Transport:
    """``s3://bucket/key`` URLs, on the run's shared client for ``endpoint_url``."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        """The whole object at ``s3://bucket/key``, retrying as ``retry`` says.

        A try that breaks mid-body resumes where it stopped, as :meth:`stream` does.

        Raises:
            SourceNotFound: ``NoSuchKey`` / ``NoSuchBucket``.
            SourcePermissionError: ``AccessDenied``, bad or missing credentials.
            SourceTimeout: The last try timed out.
            SourceError: Any other failure, naming the URL, the error code and the attempts.
        """
        what = Operation("GET", url)
        bucket, key = split_s3_url(url)
        prefix = key.split("/", 1)[0] + "/" if "/" in key else ""
        host = f"s3://{bucket}/{prefix}"
        gate = await limiter_for(f"{self.endpoint_url or ''}|{host}", redact_url(host))
        return await retry_whole(s3_client(self.endpoint_url, timeout),
                                 functools.partial(_tries, url, what, retry), what=what,
                                 retry=retry, timeout=timeout, gate=gate)

    def stream(self, url: str, *, retry: Retry, timeout: Timeout) -> AsyncGenerator[bytes, None]:
        """The object in chunks; a broken try resumes (``Range``, ``IfMatch``) where it stopped."""
        what = f"GET {redact_url(url)}"
        reader = functools.partial(_tries, url, what, retry)
        return retry_stream(s3_client(self.endpoint_url, timeout), reader, what=what,
                            retry=retry, timeout=timeout)

    async def list(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[ObjectInfo, None]:
        """Every key under the prefix (folder markers skipped), page after page, in order."""
        bucket, prefix = split_s3_url(url)
        what = f"LIST {redact_url(url)}"
        token: str | None = None
        async with s3_client(self.endpoint_url, timeout) as client:
            while True:
                page = functools.partial(list_page, client, bucket, prefix, token, what=what,
                                         retry=retry)
                objects, token = await with_retries(page, what=what, retry=retry, timeout=timeout)
                for obj in objects:
                    key = obj["Key"]
                    if not key.endswith("/"):
                        etag = obj.get("ETag")
                        yield ObjectInfo(f"s3://{bucket}/{key}", obj.get("Size"),
                                         etag.strip('"') if etag else None)
                if token is None:
                    return
