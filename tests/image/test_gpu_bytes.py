"""``image.decode_batches``: the GPU decode path for bytes from anywhere (in memory, HTTP on
127.0.0.1), on the CPU with the stand-in decoder and on CUDA with each GPU decoder."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from asyncflow import ConfigError, Pipeline, PipelineError, image, read_bytes
from asyncflow.image import _decode, _gpu_bytes, _gpu_decoders
from tests.servers import fault_server

from . import _pictures as P
from .test_folder_gpu import StandIn, _levels

ITEMS = [P.jpeg(w, h, seed=i) for i, (w, h) in
         enumerate([(200, 150), (331, 257), (640, 480), (90, 160), (500, 300), (257, 257)])]
ITEMS.append(P.progressive_jpeg(210, 160, seed=7))
ITEMS.append(P.encode(Image.fromarray(P.smooth(120, 90, seed=8)), "PNG"))


@pytest.fixture(params=["stand-in", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    if request.param == "stand-in":
        stand_in = StandIn()
        monkeypatch.setattr(_gpu_bytes, "decode_path",
                            lambda d, dev: (torch.device("cpu"), stand_in, "stand-in"))
        return {"device": "cpu", "decode": "cuda"}
    if not torch.cuda.is_available() or not _gpu_decoders.available():
        pytest.skip("needs CUDA and a GPU JPEG decoder")
    return {"device": "cuda", "decode": "cuda"}


def _cpu_rows(items: list[bytes], **kw: Any) -> np.ndarray:
    import zlib

    return np.stack([_decode.decode(d, size=kw["size"], train=kw.get("train", False),
                                    seed=kw.get("seed", 0), epoch=0,
                                    index=zlib.crc32(bytes(d)), layout="chw") for d in items])


def test_labelled_bytes_give_the_cpu_kernel_s_batches(gpu: dict[str, Any]) -> None:
    kw = {"size": 48, "train": True, "seed": 3}
    pipe = image.decode_batches(Pipeline([(d, i) for i, d in enumerate(ITEMS)]), batch_size=3,
                                normalize=False, **gpu, **kw)
    got = [(x.cpu(), y.cpu()) for x, y in pipe]
    assert [y.tolist() for _, y in got] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    images = torch.cat([x for x, _ in got])
    want = torch.from_numpy(_cpu_rows(ITEMS, **kw))
    levels = _levels(images, want)
    assert levels.mean() <= 2.0 and levels.max() <= 4.0


def test_bytes_over_http_name_their_url_when_they_fail(gpu: dict[str, Any]) -> None:
    with fault_server() as server:
        urls = [server.put(f"img{i}.jpg", d) for i, d in enumerate(ITEMS[:5])]
        urls.insert(2, server.put("bad.jpg", b"not a picture"))
        blobs = Pipeline(urls).map(read_bytes, concurrency=4)
        pipe = image.decode_batches(blobs, batch_size=2, size=32, max_failures=1, **gpu)
        got = [(x.cpu(), y.cpu()) for x, y in pipe]
        assert [len(y) for _, y in got] == [2, 2, 1]
        assert all(x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32) for x, _ in got)
        (failure,) = pipe.stats().failures
        assert failure.stage == "decode" and "bad.jpg" in failure.item
        strict = image.decode_batches(Pipeline(urls).map(read_bytes), batch_size=2, size=32,
                                      **gpu)
        with pytest.raises(PipelineError) as info:
            list(strict)
        assert re.search(r"bad\.jpg", str(info.value.exceptions[0]))


def test_a_failing_presigned_url_is_named_without_its_secrets(gpu: dict[str, Any]) -> None:
    from asyncflow._blob import Blob

    url = "https://user:pw@host/bad.jpg?X-Amz-Signature=SECRET1&X-Amz-Credential=SECRET2"
    items = [Blob(ITEMS[0], "https://host/a.jpg"), Blob(b"not a picture", url)]
    for where in (gpu, {"device": "cpu", "decode": "cpu"}):  # the readers, then the CPU path
        pipe = image.decode_batches(Pipeline(items), batch_size=2, size=32, max_failures=1,
                                    **where)
        assert [len(y) for _, y in pipe] == [1]
        (failure,) = pipe.stats().failures
        assert "bad.jpg" in failure.message and "SECRET" not in repr(failure)
        assert "pw" not in failure.message
        with pytest.raises(PipelineError) as info:
            list(image.decode_batches(Pipeline(items), batch_size=2, size=32, **where))
        error = info.value.exceptions[0]
        assert "bad.jpg" in str(error) and "SECRET" not in f"{error} {error.__notes__}"
        assert ":pw@" not in str(error)


def test_without_a_gpu_the_cpu_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = image.decode_batches(Pipeline(ITEMS), batch_size=4, size=40, device="cpu",
                                normalize=False)
    got = [x for x, _ in pipe]
    assert torch.equal(torch.cat(got), torch.from_numpy(_cpu_rows(ITEMS, size=40)))
    assert any("decode='auto'" in n for n in pipe.stats().notes)
    with pytest.raises(ConfigError, match="resize"):  # not a failure of every image
        image.decode_batches(Pipeline(ITEMS), batch_size=4, size=40, resize=0)
    with pytest.raises(ConfigError, match="max_pixels"):
        image.decode_batches(Pipeline(ITEMS), batch_size=4, size=40, max_pixels=None)
    with pytest.raises(ConfigError, match="decode='cuda' needs device"):
        image.decode_batches(Pipeline(ITEMS), batch_size=4, size=40, device="cpu",
                             decode="cuda")


def test_gray_bytes_go_to_the_cpu_kernel_where_the_decoder_refuses_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from .test_gpu_refusals import RefusesGray

    stand_in = RefusesGray()
    stand_in.takes_gray = False
    monkeypatch.setattr(_gpu_bytes, "decode_path",
                        lambda d, dev: (torch.device("cpu"), stand_in, "stand-in"))
    gray = P.encode(Image.fromarray(P.smooth(120, 90, seed=3)).convert("L"), "JPEG", quality=90)
    items = [ITEMS[0], gray, ITEMS[1]]
    kw = {"size": 40, "train": True, "seed": 1}
    pipe = image.decode_batches(Pipeline(items), batch_size=3, normalize=False,
                                device="cpu", decode="cuda", **kw)
    (images, _), = [(x, y) for x, y in pipe]
    assert stand_in.calls == 1  # the two colour JPEGs; the gray one never reached it
    levels = _levels(images, torch.from_numpy(_cpu_rows(items, **kw)))
    assert levels.max() <= 4.0
