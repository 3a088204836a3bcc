"""The GPU path on a CUDA device: stream ordering, flat device memory, each decoder's choice.

All marked ``gpu``: they need CUDA and a GPU JPEG decoder (nvImageCodec or torchvision), and
are skipped without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from asyncflow import image
from asyncflow.image import _gpu, _gpu_decoders

from . import _pictures as P

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not _gpu_decoders.available(),
                       reason="needs CUDA and a GPU JPEG decoder"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    P.write_tree(tmp_path, {"a": 20, "b": 20, "c": 8}, size=(320, 240))
    return tmp_path




def _sums(pipe: Any, sync: bool) -> list[float]:
    sums = []
    for images, labels in pipe:
        if sync:
            torch.cuda.synchronize()
        # read at once, on the consumer's stream
        sums.append(float(images.double().sum().item()) + float(labels.sum().item()))
    return sums


def _slow_decoders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the decoding stream busy (~50 ms) before each batch's last kernel, as a long
    decode or a busy GPU would."""
    real = _gpu.GpuDecodeNode._finish

    def slow(self: Any, values: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(100_000_000)
        return real(self, values)

    monkeypatch.setattr(_gpu.GpuDecodeNode, "_finish", slow)

def _pipe(tree: Path) -> Any:
    return image.folder(tree, batch_size=8, size=64, train=True, seed=3, device="cuda",
                        decode="cuda", normalize=False)


def test_the_consumer_never_reads_a_batch_before_its_decode_ends(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = _sums(_pipe(tree), sync=True)
    _slow_decoders(monkeypatch)
    assert _sums(_pipe(tree), sync=False) == want


def test_without_the_wait_the_consumer_would_read_early(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: with the consumer's wait removed, it reads unfinished rows."""
    want = _sums(_pipe(tree), sync=True)
    _slow_decoders(monkeypatch)
    monkeypatch.setattr(_gpu.GpuDecodeNode, "receive",
                        lambda self, item: item.batch if isinstance(item, _gpu.GpuBatch) else item)
    assert _sums(_pipe(tree), sync=False) != want


def test_device_memory_stays_flat_over_ten_epochs(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=8, size=96, train=True, seed=1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for x, _ in pipe:
        x.sum()
    torch.cuda.synchronize()
    first = torch.cuda.max_memory_reserved()
    for _ in range(9):
        for x, _ in pipe:
            x.sum()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_reserved() <= first * 1.05


@pytest.mark.parametrize("name", ["nvimagecodec", "torchvision"])
def test_each_decoder_passes_its_self_test(name: str) -> None:
    if name not in _gpu_decoders.available():
        pytest.skip(f"{name} is not installed")
    decoder = _gpu_decoders.choose(torch.device("cuda", 0), name)
    data = bytearray(P.jpeg(64, 48, seed=1))
    (picture,) = decoder.decode([data])
    assert picture.is_cuda and picture.dtype == torch.uint8
    assert picture.shape == ((3, 48, 64) if decoder.layout == "chw" else (48, 64, 3))
