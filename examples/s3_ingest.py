"""Read every object under an S3 prefix with hundreds of requests in flight, decode and batch.

    python examples/s3_ingest.py s3://bucket/train/
    python examples/s3_ingest.py s3://bucket/train/ --endpoint-url http://127.0.0.1:9000

Works against AWS S3 and any S3-compatible store (MinIO, Ceph, R2, moto, ...). Credentials and
region come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``~/.aws``, instance roles); the endpoint from ``--endpoint-url`` or ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``. Needs the ``s3`` extra (aiobotocore).

Objects whose names end in an image extension are decoded to 224x224 and batched; with
``--raw`` every object is only read, and the run reports bytes per second.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncflow
from asyncflow import Pipeline, image, sources

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


async def ingest(args: argparse.Namespace) -> None:
    # endpoint_url=None means the standard AWS configuration (AWS_ENDPOINT_URL_S3, ...).
    urls = sources.list_objects(args.prefix, endpoint_url=args.endpoint_url)   # paginated
    read = functools.partial(asyncflow.read_bytes, endpoint_url=args.endpoint_url)

    async def images_only() -> AsyncIterator[str]:
        async for url in urls:
            if url.lower().endswith(IMAGE_SUFFIXES):
                yield url

    def decode(data: bytes) -> Any:
        return image.decode(data, size=args.size)                # HxWx3 uint8, resized + cropped

    pipe = Pipeline(urls if args.raw else images_only()).map(
        read, concurrency=args.concurrency, ordered=False, name="read"     # requests in flight
    )
    if args.raw:
        pipe = pipe.map(len, name="size").batch(args.batch_size)
    else:
        pipe = (
            pipe.map(decode, concurrency=args.decode_threads, ordered=False, name="decode")
            .batch(args.batch_size)
            .map(image.collate, name="collate")                  # one uint8 NCHW tensor
        )

    start = time.perf_counter()
    objects = nbytes = batches = 0
    async for batch in pipe:
        batches += 1
        objects += len(batch)
        nbytes += sum(batch) if args.raw else batch.numel()
        if args.limit and objects >= args.limit:
            break
    elapsed = time.perf_counter() - start
    what = "bytes read" if args.raw else "bytes of decoded pixels"
    print(f"{objects} objects in {elapsed:.2f} s: {objects / elapsed:,.0f} objects/s, "
          f"{nbytes / elapsed / 1e6:,.1f} MB/s of {what} ({batches} batches)")
    print(pipe.stats())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", help="s3://bucket/prefix/")
    parser.add_argument("--endpoint-url", help="an S3-compatible endpoint")
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight")
    parser.add_argument("--decode-threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--limit", type=int, default=0, help="stop after this many objects")
    parser.add_argument("--raw", action="store_true", help="read only; no decoding")
    args = parser.parse_args()
    asyncio.run(ingest(args))


if __name__ == "__main__":
    main()
