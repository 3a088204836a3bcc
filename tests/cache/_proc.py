"""A process using a cache, for the crash and concurrency tests (run as a script).

    python _proc.py PATH COUNT DELAY READY_AFTER [wait]

Iterates ``Pipeline(range(COUNT)).map(make).cache(PATH, batched=True)`` once, each item a
batch (uint8 [4, 16], int64 [4]) made in DELAY seconds; prints ``ready`` after READY_AFTER
items were made, and at the end one JSON line: a digest of what it iterated, how many items
upstream made, and the ``asyncflow.cache`` log messages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from typing import Any

import numpy as np

from asyncflow import Pipeline


def make_batch(i: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((4, 16), i % 251, np.uint8), np.arange(4 * i, 4 * i + 4)


def digest_of(batches: Any) -> str:
    digest = hashlib.sha256()
    for images, labels in batches:
        digest.update(np.ascontiguousarray(images).tobytes())
        digest.update(np.ascontiguousarray(labels).tobytes())
    return digest.hexdigest()


def main() -> None:
    path, count, delay, ready_after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(
        sys.argv[4])
    wait = sys.argv[5:] == ["wait"]
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("asyncflow.cache")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    made: list[int] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(delay)
        made.append(i)
        if len(made) == ready_after:
            print("ready", flush=True)
        return make_batch(i)

    pipe = Pipeline(range(count)).map(make).cache(path, batched=True, wait=wait)
    print(json.dumps({"digest": digest_of(pipe), "made": len(made), "log": messages}),
          flush=True)


if __name__ == "__main__":
    main()
