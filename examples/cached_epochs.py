"""Decode once, train many epochs: an image folder cached as uint8 batches, replayed shuffled.

    python examples/cached_epochs.py                        # the sample photos, 3 classes
    python examples/cached_epochs.py --data DIR --cache /fast/disk/train-64 --epochs 10

Epoch 0 decodes the JPEGs and writes each batch to a memory-mapped cache as it passes; every
later epoch replays the cache in a new order (``shuffle(seed=epoch)``) without decoding. The
cache keeps ``normalize=False`` uint8 images, four times smaller than float32; they are
normalized on the training device, and the random flip is applied after the cache, so that it
differs from epoch to epoch. Run it twice with the same ``--data`` and ``--cache``: the second
run decodes nothing (without ``--data``, each run makes its sample images anew, in another
place, and the cache log says that the listing changed and rebuilds it).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from asyncflow import image


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    )


def train(args: argparse.Namespace, root: Path, cache_dir: Path) -> None:
    device = torch.device(args.device)
    source = image.folder(root, batch_size=args.batch_size, size=args.size, normalize=False,
                          seed=0)
    pipe = source.cache(cache_dir)
    model = small_cnn(len(source.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    flips = torch.Generator().manual_seed(0)
    print(f"{len(source.classes)} classes: {', '.join(source.classes)}; cache: {cache_dir}")

    for epoch in range(args.epochs):
        seen, total_loss, start = 0, 0.0, time.perf_counter()
        for images, labels in pipe.shuffle(seed=epoch):  # epoch 0 fills, later ones replay
            images = image.normalize(images.to(device, non_blocking=True))
            flip = torch.rand(len(images), generator=flips) < 0.5
            images[flip.to(device)] = images[flip.to(device)].flip(-1)
            labels = labels.to(device, non_blocking=True)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(labels)
            total_loss += loss.item() * len(labels)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: loss {total_loss / max(seen, 1):.3f}, "
              f"{seen / elapsed:,.0f} images/s")
    print()
    print(pipe.info())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path,
                        help="image folder; default: one cut from the sample photos")
    parser.add_argument("--images", type=int, default=256,
                        help="images to make when --data is not given")
    parser.add_argument("--cache", type=Path,
                        help="cache directory (default: a temporary one, removed at the end)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    # The cache says what it does with each epoch: fills it, replays it, or rebuilds it and why.
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("asyncflow.cache").setLevel(logging.INFO)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            from asyncflow.image import sample_folder

            root = sample_folder(Path(tmp) / "images", args.images)
        train(args, root, args.cache or Path(tmp) / "cache")


if __name__ == "__main__":
    main()
