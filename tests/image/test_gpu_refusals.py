"""The GPU stage's pictures that its decoder refuses, or gives in another form: found in
halves (a few calls, not one per picture), counted and reported; a gray JPEG's single channel
is repeated into three rather than refused."""

from __future__ import annotations

import io
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from asyncflow import image
from asyncflow.image import _folder

from . import _pictures as P
from .test_folder_gpu import StandIn, _batches, _levels


class GrayAsOneChannel(StandIn):
    """Gives a gray JPEG as a ``1 x H x W`` picture, as a GPU decoder may."""

    def decode(self, data: Any) -> list[torch.Tensor]:
        out = super().decode(data)
        for i, d in enumerate(data):
            with Image.open(io.BytesIO(bytes(d))) as im:
                if im.mode == "L":
                    out[i] = out[i][:1].contiguous()
        return out


def _use(monkeypatch: pytest.MonkeyPatch, decoder: StandIn) -> None:
    """``decode="cuda"`` takes the GPU path with ``decoder`` (on the CPU); ``"cpu"`` is left
    as it is, to compare with."""
    real = _folder.decode_path

    def path(decode: Any, device: Any) -> Any:
        if decode != "cuda":
            return real(decode, device)
        return torch.device("cpu"), decoder, "stand-in"

    monkeypatch.setattr(_folder, "decode_path", path)


def _same_as_cpu(root: Path, **kw: Any) -> None:
    got = _batches(image.folder(root, decode="cuda", **kw))
    want = _batches(image.folder(root, decode="cpu", workers="threads", **kw))
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert _levels(g, w).max() <= 4.0


def test_one_refused_picture_costs_a_few_calls_and_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    P.write_tree(tmp_path, {"a": 31}, size=(64, 48))
    marked = P.encode(Image.fromarray(P.smooth(70, 50, seed=5)), "JPEG", quality=90,
                      comment=b"refuse-me")
    (tmp_path / "a" / "marked.jpg").write_bytes(marked)
    stand_in = StandIn(refuse=b"refuse-me")
    _use(monkeypatch, stand_in)
    kw = {"batch_size": 32, "size": 24, "train": True, "seed": 3, "normalize": False}
    with caplog.at_level(logging.WARNING, logger="asyncflow.image"):
        _same_as_cpu(tmp_path, **kw)
    calls_gpu_run = stand_in.calls
    # one batch of 32 with one refused picture: the halves that hold it, down to it
    assert calls_gpu_run <= 1 + 2 * math.ceil(math.log2(32))
    warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert warnings and "refused 1 of 32 JPEGs" in warnings[0], warnings


def test_a_gray_picture_in_one_channel_is_taken_not_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "g").mkdir()
    for i in range(5):
        gray = Image.fromarray(P.smooth(90 + 7 * i, 70, seed=i)).convert("L")
        (tmp_path / "g" / f"gray{i}.jpg").write_bytes(P.encode(gray, "JPEG", quality=90))
    (tmp_path / "g" / "colour.jpg").write_bytes(P.jpeg(80, 60, seed=9))
    assert np.asarray(Image.open(tmp_path / "g" / "gray0.jpg")).ndim == 2  # stored gray
    stand_in = GrayAsOneChannel()
    _use(monkeypatch, stand_in)
    with caplog.at_level(logging.WARNING, logger="asyncflow.image"):
        _same_as_cpu(tmp_path, batch_size=3, size=32, train=True, seed=1, normalize=False)
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    assert stand_in.calls == 2  # one call a batch: nothing was refused


class RefusesGray(StandIn):
    """Raises on a batch that holds a gray JPEG, as a GPU decoder without gray support may."""

    def decode(self, data: Any) -> list[torch.Tensor]:
        for d in data:
            with Image.open(io.BytesIO(bytes(d))) as im:
                if im.mode == "L":
                    self.calls += 1
                    raise RuntimeError("no gray JPEGs here")
        return super().decode(data)


class GrayWrong(StandIn):
    """Decodes a gray JPEG to the wrong values (black)."""

    def decode(self, data: Any) -> list[torch.Tensor]:
        return [torch.zeros_like(p) for p in super().decode(data)]


def test_whether_a_decoder_takes_gray_jpegs_is_tested_once_up_front() -> None:
    from asyncflow.image._gpu_decoders import takes_gray

    assert takes_gray(StandIn()) and takes_gray(GrayAsOneChannel())
    assert not takes_gray(RefusesGray()) and not takes_gray(GrayWrong())


def test_the_colour_self_test_raises_what_is_wrong() -> None:
    """The same test picture checks colour when a decoder is chosen: wrong values or its
    own error put it aside with the reason."""
    from asyncflow.image._gpu_decoders import _self_test

    _self_test(StandIn())
    with pytest.raises(RuntimeError, match=r"test JPEG of RGB \(200, 30, 60\) decoded to"):
        _self_test(GrayWrong())
    with pytest.raises(RuntimeError, match="stand-in refuses"):
        _self_test(StandIn(refuse=b"JFIF"))


def test_gray_jpegs_go_to_the_cpu_kernel_where_the_decoder_refuses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The readers route them, so no batch holds a picture its decoder refuses: one call a
    batch, none refused, the CPU path's rows."""
    (tmp_path / "g").mkdir()
    for i in range(4):
        gray = Image.fromarray(P.smooth(80 + 9 * i, 64, seed=i)).convert("L")
        (tmp_path / "g" / f"gray{i}.jpg").write_bytes(P.encode(gray, "JPEG", quality=90))
        (tmp_path / "g" / f"colour{i}.jpg").write_bytes(P.jpeg(90, 70, seed=10 + i))
    stand_in = RefusesGray()
    stand_in.takes_gray = False  # as choose() finds with takes_gray()
    _use(monkeypatch, stand_in)
    with caplog.at_level(logging.WARNING, logger="asyncflow.image"):
        _same_as_cpu(tmp_path, batch_size=4, size=32, train=True, seed=2, normalize=False)
    assert stand_in.calls == 2  # the two batches' colour JPEGs, one call each
    assert not [r for r in caplog.records if "refused" in r.getMessage()]


def test_a_refused_picture_is_decoded_on_the_cpu_under_the_run_s_max_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CPU kernel's fallback in the GPU stage used the kernel's default max_bytes (256 MiB)
    # whatever the run's: with max_bytes=None, a larger JPEG the GPU refused then failed.
    from asyncflow.image import _gpu

    P.write_tree(tmp_path, {"a": 2})
    _use(monkeypatch, StandIn(refuse=b""))  # refuses every picture
    limits = []
    real = _gpu.decode

    def decode(*args: Any, **kw: Any) -> Any:
        limits.append(kw.get("max_bytes", "the kernel's default"))
        return real(*args, **kw)

    monkeypatch.setattr(_gpu, "decode", decode)
    for max_bytes in (None, 10**9):
        limits.clear()
        got = _batches(image.folder(tmp_path, batch_size=2, size=16, decode="cuda",
                                    max_bytes=max_bytes, workers="threads"))
        assert [len(y) for _, y in got] == [2] and limits == [max_bytes] * 2
