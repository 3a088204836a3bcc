"""The JPEG decoders the GPU path can use, found lazily, and the choice between them.

Two libraries decode batches of JPEGs on an NVIDIA GPU:

* **nvImageCodec** (``nvidia-nvimgcodec-cu12`` / ``-cu13``, the ``asyncflow[gpu]`` extra):
  NVIDIA's codec library, whose nvJPEG back ends include the A100's, H100's and H200's
  hardware JPEG engine, and which depends on no particular torch;
* **torchvision** (``torchvision.io.decode_jpeg(device="cuda")``): batched nvJPEG through
  torch's own allocator; installed beside torch by most users, but each torchvision release
  pins one torch, so asyncflow never installs it.

``"auto"`` takes torchvision where it imports, else nvImageCodec: on an H100, batches of 64
ImageNet-sized JPEGs decoded at 16,287 images/s with torchvision and 9,944 with nvImageCodec
(its hardware engine first), which also used more host CPU (docs/dependencies.md). Each
decoder returns the pictures as stored (no EXIF orientation applied: the resampler applies it
with the crop) on the current CUDA stream.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from .._errors import ConfigError

__all__ = ["GpuDecoder", "available", "choose", "takes_gray"]


class GpuDecoder(Protocol):
    """Decodes JPEG bytes to pictures on one device."""

    #: What ``stats().notes`` and the journal call it.
    name: str
    #: ``"chw"`` (planar, as torchvision) or ``"hwc"`` (interleaved, as nvImageCodec).
    layout: str
    #: Whether it decodes a gray JPEG right (to one channel or three); set by :func:`choose`.
    #: Where it does not, the readers send gray JPEGs to the CPU kernel, so that no batch
    #: holds a picture its decoder refuses.
    takes_gray: bool

    def decode(self, data: Sequence[bytearray]) -> list[torch.Tensor]:
        """Decode every JPEG, or raise if any fails (the caller then tries each half)."""
        ...


class TorchvisionDecoder:
    """``torchvision.io.decode_jpeg(device=...)``: batched nvJPEG, RGB, planar."""

    layout = "chw"
    takes_gray = True

    def __init__(self, device: torch.device) -> None:
        io = importlib.import_module("torchvision.io")
        self._decode = io.decode_jpeg
        self._rgb = io.ImageReadMode.RGB
        self.device = device
        version = getattr(importlib.import_module("torchvision"), "__version__", "?")
        self.name = f"torchvision {version} decode_jpeg (nvJPEG)"

    def decode(self, data: Sequence[bytearray]) -> list[torch.Tensor]:
        tensors = [torch.frombuffer(d, dtype=torch.uint8) for d in data]
        return list(self._decode(tensors, mode=self._rgb, device=self.device))


class NvImageCodecDecoder:
    """nvImageCodec's batched decoder: the GPU's hardware JPEG engine where it has one, else
    nvJPEG's CUDA decoder; RGB, planar, with libjpeg's "fancy" chroma upsampling (as the CPU
    kernel's). Each picture is wrapped as a tensor without a copy; its memory is
    nvImageCodec's, so the caller keeps the pictures until the stream has read them."""

    layout = "chw"
    takes_gray = True

    def __init__(self, device: torch.device) -> None:
        codec = importlib.import_module("nvidia.nvimgcodec")
        self.device = device
        index = device.index if device.index is not None else torch.cuda.current_device()
        kinds = (codec.BackendKind.HW_GPU_ONLY, codec.BackendKind.GPU_ONLY)
        # Few host threads: the read threads and the trainer need the cores.
        self._decoder = codec.Decoder(device_id=index, max_num_cpu_threads=2,
                                      backends=[codec.Backend(kind) for kind in kinds],
                                      options=":fancy_upsampling=1")
        self._params = codec.DecodeParams(apply_exif_orientation=False,
                                          color_spec=codec.ColorSpec.SRGB,
                                          sample_format=codec.SampleFormat.P_RGB)
        self._stream = codec.CodeStream
        self.name = f"nvImageCodec {getattr(codec, '__version__', '?')} (nvJPEG, hardware first)"

    def decode(self, data: Sequence[bytearray]) -> list[torch.Tensor]:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        sources = [self._stream(np.frombuffer(d, np.uint8)) for d in data]
        images = self._decoder.decode(sources, params=self._params, cuda_stream=stream)
        if any(image is None for image in images):
            raise RuntimeError("nvImageCodec could not decode every picture of the batch")
        return [torch.as_tensor(image, device=self.device) for image in images]


_DECODERS: dict[str, type[Any]] = {
    "nvimagecodec": NvImageCodecDecoder,
    "torchvision": TorchvisionDecoder,
}


def available() -> list[str]:
    """The GPU decoders installed here, in ``"auto"``'s order of preference (found without
    importing them: nvImageCodec prints to stderr about each codec library it lacks)."""
    found = []
    for name, module in (("torchvision", "torchvision.io"), ("nvimagecodec", "nvidia.nvimgcodec")):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package missing, or broken
            spec = None
        if spec is not None:
            found.append(name)
    return found


def _self_test(decoder: GpuDecoder) -> None:
    """Decode a small known JPEG, so that a decoder which imports but cannot run here (a
    library built for another CUDA, a missing nvJPEG) is passed over, with the reason."""
    wrong = _wrong(decoder, "RGB", (200, 30, 60), raises=True)
    if wrong is not None:
        raise RuntimeError(wrong)


def takes_gray(decoder: GpuDecoder) -> bool:
    """Whether ``decoder`` decodes a small gray JPEG to its values, in one channel or three
    (a decoder that raises, or gives another shape or other values, does not)."""
    return _wrong(decoder, "L", (90,), raises=False) is None


def _wrong(decoder: GpuDecoder, mode: str, colour: tuple[int, ...], *,
           raises: bool) -> str | None:
    """What is wrong with ``decoder``'s picture of a 48x32 JPEG of one ``colour`` (in
    ``mode``), or ``None``; its own error is raised where ``raises``, else described."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (48, 32), colour if mode != "L" else colour[0]).save(buf, "JPEG",
                                                                         quality=95)
    try:
        (picture,) = decoder.decode([bytearray(buf.getvalue())])
    except Exception as exc:
        if raises:
            raise
        return f"{type(exc).__name__}: {exc}"
    channels = (3, 1) if mode == "L" else (3,)
    shapes = [(c, 32, 48) if decoder.layout == "chw" else (32, 48, c) for c in channels]
    if tuple(picture.shape) not in shapes:
        return f"a 48x32 test JPEG decoded to shape {tuple(picture.shape)}"
    pixel = picture[:, 16, 24] if decoder.layout == "chw" else picture[16, 24, :]
    got = [int(v) for v in pixel.cpu()]
    want = colour * len(got) if mode == "L" else colour
    if max(abs(a - b) for a, b in zip(got, want, strict=True)) > 12:
        return f"a test JPEG of {mode} {colour} decoded to {tuple(got)}"
    return None


def choose(device: torch.device, preference: str = "auto") -> GpuDecoder:
    """A decoder for ``device``: ``preference`` (``"nvimagecodec"``, ``"torchvision"``), or
    the first that works here for ``"auto"``.

    Raises:
        ConfigError: No GPU decoder can be used here; the message says what to install.
    """
    names = available() if preference == "auto" else [preference]
    errors = []
    for name in names:
        kind = _DECODERS.get(name)
        if kind is None:
            raise ConfigError(f"unknown GPU decoder {name!r}: use one of {sorted(_DECODERS)}")
        try:
            decoder: GpuDecoder = kind(device)
            _self_test(decoder)
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        decoder.takes_gray = takes_gray(decoder)
        return decoder
    tried = "; ".join(errors) if errors else "neither nvImageCodec nor torchvision is installed"
    raise ConfigError(
        "decode='cuda' needs a GPU JPEG decoder: pip install 'asyncflow[gpu]' (nvImageCodec), "
        f"or torchvision built for this torch ({tried}); or pass decode='cpu'"
    )
