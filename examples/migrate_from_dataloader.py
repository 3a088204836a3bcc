"""Moving from ``torch.utils.data.DataLoader`` to asyncflow, before and after, side by side.

    python examples/migrate_from_dataloader.py [--items 2000] [--workers 2]

1. *before*: a map-style ``Dataset`` through torch's ``DataLoader`` (worker processes);
2. *after, step 1*: the same dataset through ``asyncflow.DataLoader`` (same arguments,
   threads instead of processes); the batches are identical;
3. *after, step 2*: the same work written as a ``Pipeline``, where each part of
   ``__getitem__`` gets the executor and concurrency that suits it.
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import asyncflow
from asyncflow import Pipeline


def make_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """Small in-memory JPEGs (gradients, so they compress like pictures, not noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:96, 0:128].astype(np.float32)
    out = []
    for _ in range(count):
        a, b = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
        t = ((xx / 128 + yy / 96) / 2)[..., None]
        pixels = (a * (1 - t) + b * t).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def decode(data: bytes) -> torch.Tensor:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64))
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


class JpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """What a typical ``Dataset`` looks like: all the work for one sample in ``__getitem__``."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return decode(self.blobs[index]), index % 10


def timed(name: str, loader: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    start = time.perf_counter()
    batches = list(loader)  # type: ignore[call-overload]
    elapsed = time.perf_counter() - start
    items = sum(len(labels) for _, labels in batches)
    print(f"{name:38} {items:6d} items in {elapsed:6.2f} s  {items / elapsed:9,.0f} items/s")
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    dataset = JpegDataset(make_jpegs(args.items))

    # Before: torch's DataLoader, worker processes.
    before = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    reference = timed(f"torch DataLoader ({args.workers} processes)", before)

    # After, step 1: the same arguments; num_workers means threads.
    after = asyncflow.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    batches = timed(f"asyncflow.DataLoader ({args.workers} threads)", after)
    assert len(batches) == len(reference)
    for (x, y), (rx, ry) in zip(batches, reference, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    print("  -> identical batches")

    # After, step 2: a pipeline. Fetching bytes would be an async stage with many requests
    # in flight; decoding runs in threads; collation runs once per batch.
    def load(index: int) -> tuple[torch.Tensor, int]:
        return decode(dataset.blobs[index]), index % 10

    def collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = zip(*samples, strict=True)
        return torch.stack(images), torch.tensor(labels)

    pipe = (
        Pipeline(range(len(dataset)))
        .map(load, concurrency=args.workers, name="decode")
        .batch(args.batch_size)
        .map(collate, name="collate")
    )
    batches = timed(f"asyncflow Pipeline ({args.workers} threads)", pipe)
    for (x, y), (rx, ry) in zip(batches, reference, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    print("  -> identical batches")
    print(pipe.stats())


if __name__ == "__main__":
    main()
