"""``asyncflow demo``: the image-folder pipeline on sample data, with a progress bar and stats."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_demo"]


def _shape(batch: Any) -> str:
    shape = getattr(batch, "shape", None)
    dtype = getattr(batch, "dtype", None)
    device = getattr(batch, "device", None)
    if shape is None:
        return type(batch).__name__
    return f"{tuple(shape)} {dtype}" + (f" on {device}" if device is not None else "")


def run_demo(
    *,
    data: str | None = None,
    device: str | None = None,
    batch_size: int = 32,
    size: int = 224,
    images: int = 256,
    epochs: int = 1,
    progress: bool = True,
) -> int:
    """Run ``image.folder`` over ``data`` (or a generated folder) and print what it did."""
    from .. import ConfigError, image
    from ..report._tables import pipeline_text

    with tempfile.TemporaryDirectory(prefix="asyncflow-demo-") as tmp:
        if data is None:
            start = time.perf_counter()
            root = image.sample_folder(Path(tmp) / "images", images)
            from ..image._samples import sample_photos

            source = "the sample photos" if sample_photos() else "generated pictures"
            print(f"made {images} JPEGs from {source} in {time.perf_counter() - start:.1f} s")
        else:
            root = Path(data)
            if not root.is_dir():
                print(f"error: --data {data}: not a folder", file=sys.stderr)
                return 2
        try:
            pipe = image.folder(root, batch_size=batch_size, size=size, device=device)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{root}: {len(pipe.classes)} classes")
        if progress:
            pipe = pipe.progress(
                total=len(pipe.samples), unit="img", desc="image.folder",
                count=lambda batch: len(batch[1]),
            )
        print(pipeline_text(pipe), flush=True)
        for epoch in range(epochs):
            count, first = 0, None
            start = time.perf_counter()
            for batch, labels in pipe:
                count += len(labels)
                first = first or _shape(batch)
            elapsed = time.perf_counter() - start
            sys.stderr.flush()
            print(f"epoch {epoch}: {count} images in {elapsed:.2f} s = "
                  f"{count / max(elapsed, 1e-9):,.0f} images/s; batches of {first}")
        print(pipe.stats())
        if data is None:
            print("next: `asyncflow demo --data DIR` on your own image folder (one sub-folder "
                  "per class), or `python examples/train_image_folder.py`")
    return 0
