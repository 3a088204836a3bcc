"""Train a small CNN on an image folder, fed by ``image.folder`` inside an async training loop.

    python examples/train_image_folder.py                     # the sample photos, 3 classes
    python examples/train_image_folder.py --data DIR --epochs 5 --device cuda

``DIR`` holds one sub-folder per class (torchvision's ``ImageFolder`` layout). The training
step is ordinary synchronous PyTorch; it blocks the loop while it computes, and the pipeline
keeps decoding on its own thread meanwhile, so batches arrive at the pace of the slower of the
two, not the sum.
"""

from __future__ import annotations

import argparse
import asyncio
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
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


async def train(args: argparse.Namespace, root: Path) -> None:
    device = torch.device(args.device)
    pipe = image.folder(
        root, batch_size=args.batch_size, size=args.size, train=True, seed=0,
        device=args.device if device.type != "cpu" else None,
    )
    model = small_cnn(len(pipe.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print(f"{len(pipe.classes)} classes: {', '.join(pipe.classes)}")

    for epoch in range(args.epochs):
        model.train()
        seen, total_loss, correct, steps = 0, 0.0, 0, 0
        start = time.perf_counter()
        async for images, labels in pipe:            # the event loop stays free between steps
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = loss_fn(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(labels)
            total_loss += loss.item() * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            steps += 1
            if args.max_steps and steps >= args.max_steps:
                break
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: loss {total_loss / max(seen, 1):.3f}, "
              f"train accuracy {correct / max(seen, 1):.1%}, "
              f"{seen / elapsed:,.0f} images/s")
    print(pipe.stats())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path,
                        help="image folder; default: one cut from the sample photos")
    parser.add_argument("--images", type=int, default=256,
                        help="images to make when --data is not given")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch early")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            from asyncflow.image import sample_folder

            root = sample_folder(Path(tmp) / "images", args.images)
        asyncio.run(train(args, root))


if __name__ == "__main__":
    main()
