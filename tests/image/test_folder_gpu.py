"""``image.folder(decode="cuda")``: the GPU path against the CPU path on the same folder.

Every test runs on the CPU with a stand-in decoder (PIL decoding whole pictures, as nvJPEG
gives them: everything but the device is the GPU path's own code), and on CUDA with each GPU
decoder installed (marked ``gpu``; skipped without one).
"""

from __future__ import annotations

import io
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from asyncflow import ConfigError, DecodeError, PipelineError, image
from asyncflow.image import _folder, _gpu, _gpu_decoders, _jpeg
from asyncflow.pipeline import Span

from . import _pictures as P


class StandIn:
    """Decodes whole JPEGs with PIL, planar, on the CPU; refuses the files it is told to."""

    name = "PIL stand-in"
    layout = "chw"

    def __init__(self, refuse: bytes = b"\x00never") -> None:
        self.refuse = refuse
        self.calls = 0

    def decode(self, data: Any) -> list[torch.Tensor]:
        self.calls += 1
        out = []
        for d in data:
            if self.refuse in bytes(d):
                raise RuntimeError("stand-in refuses this picture")
            with Image.open(io.BytesIO(bytes(d))) as im:  # refuses damaged data, as nvJPEG
                _jpeg.load(im, _jpeg.inspect(bytes(d), "stand-in"), bytes(d), "stand-in")
                arr = np.asarray(im.convert("RGB")).copy()
            out.append(torch.from_numpy(arr).permute(2, 0, 1).contiguous())
        return out


def _cuda_decoders() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return _gpu_decoders.available()


PATHS = ["stand-in", *[pytest.param(f"cuda-{n}", marks=pytest.mark.gpu)
                       for n in ("nvimagecodec", "torchvision")]]


@pytest.fixture(params=PATHS)
def gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """How to ask ``image.folder`` for the GPU path: its extra arguments."""
    kind = request.param
    if kind == "stand-in":
        stand_in = StandIn()
        real = _folder.decode_path

        def path(decode: Any, device: Any) -> Any:
            if decode != "cuda":
                return real(decode, device)
            return torch.device("cpu"), stand_in, f"JPEGs decode with {stand_in.name}"

        monkeypatch.setattr(_folder, "decode_path", path)
        yield {"decode": "cuda", "_decoder": stand_in}
        return
    name = kind.removeprefix("cuda-")
    if name not in _cuda_decoders():
        pytest.skip(f"needs CUDA and {name}")
    monkeypatch.setattr(_gpu_decoders, "available", lambda: [name])
    yield {"decode": "cuda", "device": "cuda"}


def _folder_with(gpu: dict, root: Path, **kw: Any) -> Any:
    args = {k: v for k, v in gpu.items() if not k.startswith("_")}
    return image.folder(root, **args, **kw)


def _batches(pipe: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.cpu(), y.cpu()) for x, y in pipe]


def _levels(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Per-image mean absolute difference of two uint8 batches, in 0-255 levels."""
    return (a.float() - b.float()).abs().flatten(1).mean(1).numpy()


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Photos and photo-like JPEGs of many sizes and orientations, in two classes."""
    root = tmp_path / "photos"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i, path in enumerate(P.PHOTOS):
        (root / "a" / f"photo{i}.jpg").write_bytes(path.read_bytes())
    sizes = [(96, 72), (300, 220), (640, 480), (1200, 900), (500, 333), (211, 377)]
    for i, (w, h) in enumerate(sizes):
        (root / "b" / f"smooth{i}.jpg").write_bytes(P.jpeg(w, h, seed=i, quality=85))
    for o in (3, 6, 8):
        im = Image.fromarray(P.smooth(260, 180, seed=o))
        (root / "a" / f"turned{o}.jpg").write_bytes(P.with_orientation(im, o))
    return root


@pytest.mark.parametrize("train", [True, False])
def test_same_batches_as_the_cpu_path_within_tolerance(gpu: dict, photos: Path,
                                                       train: bool) -> None:
    kw = {"batch_size": 4, "size": 64, "train": train, "seed": 5, "normalize": False}
    got = _batches(_folder_with(gpu, photos, **kw))
    want = _batches(image.folder(photos, decode="cpu", workers="threads", **kw))
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    levels = np.concatenate([_levels(g, w) for (g, _), (w, _) in zip(got, want, strict=True)])
    assert levels.mean() <= 2.0 and levels.max() <= 4.0, levels


def test_normalized_batches_are_float_and_match(gpu: dict, photos: Path) -> None:
    kw = {"batch_size": 5, "size": 48, "train": True, "seed": 2}
    got = _batches(_folder_with(gpu, photos, **kw))
    want = _batches(image.folder(photos, decode="cpu", workers="threads", **kw))
    for (g, gl), (w, wl) in zip(got, want, strict=True):
        assert g.dtype == torch.float32 and g.shape == w.shape and torch.equal(gl, wl)
        assert float((g - w).abs().mean()) * 255 * 0.226 <= 2.0


def _mixed(root: Path) -> dict[str, str]:
    """A folder of everything a GPU decoder may refuse; the names of the bad files."""
    (root / "x").mkdir(parents=True)
    (root / "y").mkdir(parents=True)
    photo = Image.fromarray(P.smooth(180, 140, seed=3))
    files = {
        "x/plain.jpg": P.jpeg(200, 150, seed=1),
        "x/gray.jpg": P.encode(photo.convert("L"), "JPEG", quality=90),
        "x/cmyk.jpg": P.encode(photo.convert("CMYK"), "JPEG", quality=90),
        "x/progressive.jpg": P.progressive_jpeg(210, 160, seed=2),
        "x/picture.png": P.encode(photo, "PNG"),
        "y/plain2.jpg": P.jpeg(330, 250, seed=4),
        "y/truncated.jpg": P.jpeg(300, 200, seed=5)[:1500] + P.EOI,
        "y/text.jpg": b"this is not a picture at all",
        "y/empty.jpg": b"",
        "y/plain3.jpg": P.jpeg(150, 300, seed=6),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return {"truncated.jpg", "text.jpg", "empty.jpg"}


def _failed_names(pipe: Any) -> list[str]:
    return sorted(re.findall(r"[\w.]+\.(?:jpg|png)", f.item)[-1] for f in pipe.stats().failures)


def test_a_mixed_folder_falls_back_and_fails_as_on_the_cpu(gpu: dict, tmp_path: Path) -> None:
    bad = _mixed(tmp_path)
    kw = {"batch_size": 3, "size": 40, "train": True, "seed": 9, "normalize": False,
          "max_failures": 3}
    pipe = _folder_with(gpu, tmp_path, **kw)
    cpu = image.folder(tmp_path, decode="cpu", workers="threads", **kw)
    got, want = _batches(pipe), _batches(cpu)
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert _levels(g, w).max() <= 4.0
    assert _failed_names(pipe) == _failed_names(cpu) == sorted(bad)
    assert {f.stage for f in pipe.stats().failures} == {"batch"}
    assert {f.error_type for f in pipe.stats().failures} == {"DecodeError"}


def test_past_max_failures_the_run_fails_naming_the_file(gpu: dict, tmp_path: Path) -> None:
    _mixed(tmp_path)
    pipe = _folder_with(gpu, tmp_path, batch_size=3, size=40, max_failures=1)
    with pytest.raises(PipelineError) as info:
        _batches(pipe)
    (error,) = info.value.exceptions
    assert isinstance(error, DecodeError) and re.search(r"(truncated|text|empty)\.jpg",
                                                        str(error))


def test_a_picture_the_gpu_decoder_refuses_is_decoded_on_the_cpu(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    P.write_tree(tmp_path, {"a": 5, "b": 4}, size=(120, 90))
    marked = P.encode(Image.fromarray(P.smooth(130, 100, seed=77)), "JPEG", quality=90,
                      comment=b"refuse-me")
    (tmp_path / "a" / "marked.jpg").write_bytes(marked)
    stand_in = StandIn(refuse=b"refuse-me")
    real = _folder.decode_path  # decode="cpu" stays the CPU path, to compare with
    monkeypatch.setattr(_folder, "decode_path", lambda d, dev: (
        (torch.device("cpu"), stand_in, "stand-in") if d == "cuda" else real(d, dev)))
    kw = {"batch_size": 4, "size": 32, "train": True, "seed": 1, "normalize": False}
    got = _batches(image.folder(tmp_path, decode="cuda", **kw))
    want = _batches(image.folder(tmp_path, decode="cpu", workers="threads", **kw))
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert _levels(g, w).max() <= 4.0
    assert stand_in.calls > 3  # the refused batch was retried in halves


def test_resume_delivers_what_an_uninterrupted_run_does(gpu: dict, photos: Path) -> None:
    kw = {"batch_size": 3, "size": 32, "train": True, "seed": 4, "normalize": False}
    whole = _batches(_folder_with(gpu, photos, **kw))
    pipe = _folder_with(gpu, photos, **kw)
    it = iter(pipe)
    head = [(x.cpu(), y.cpu()) for x, y in (next(it), next(it))]
    state = pipe.state_dict()
    it.close()
    again = _folder_with(gpu, photos, **kw)
    again.load_state_dict(state)
    tail = _batches(again)
    got = head + tail
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in whole]
    for (g, _), (w, _) in zip(got, whole, strict=True):
        assert torch.equal(g, w)


def test_stats_notes_name_the_decoder(gpu: dict, photos: Path) -> None:
    pipe = _folder_with(gpu, photos, batch_size=4, size=32)
    _batches(pipe)
    notes = " ".join(pipe.stats().notes)
    decoder = gpu.get("_decoder")
    assert (decoder.name if decoder is not None else "nvJPEG") in notes
    assert [s["kind"] for s in pipe.describe()][-1] == "custom"


def test_break_leaves_nothing_running(gpu: dict, photos: Path, leak_check: None) -> None:
    for _ in _folder_with(gpu, photos, batch_size=2, size=32):
        break


def test_decode_argument_errors(tmp_path: Path) -> None:
    P.write_tree(tmp_path, {"a": 2})
    with pytest.raises(ConfigError, match="decode must be"):
        image.folder(tmp_path, batch_size=2, size=16, decode="gpu")
    with pytest.raises(ConfigError, match="device='cuda'"):
        image.folder(tmp_path, batch_size=2, size=16, decode="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"CUDA is not available.*decode='cpu'"):
            image.folder(tmp_path, batch_size=2, size=16, decode="cuda", device="cuda")


def test_auto_decodes_on_the_cpu_without_a_cuda_device(tmp_path: Path) -> None:
    P.write_tree(tmp_path, {"a": 3})
    pipe = image.folder(tmp_path, batch_size=2, size=16)
    _batches(pipe)
    assert any("decodes on the CPU (decode='auto': no CUDA device)" in n
               for n in pipe.stats().notes)
    assert [s["kind"] for s in pipe.describe()][-1] == "assemble"


def test_readers_in_worker_processes_give_the_same_batches(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    _mixed(tmp_path)
    stand_in = StandIn()
    monkeypatch.setattr(_folder, "decode_path",
                        lambda d, dev: (torch.device("cpu"), stand_in, "stand-in"))
    kw = {"batch_size": 3, "size": 32, "train": True, "seed": 2, "normalize": False,
          "max_failures": 3, "decode": "cuda"}
    threads = image.folder(tmp_path, workers="threads", **kw)
    processes = image.folder(tmp_path, workers="processes", **kw)
    got, want = _batches(processes), _batches(threads)
    assert len(got) == len(want)
    for (g, gl), (w, wl) in zip(got, want, strict=True):
        assert torch.equal(g, w) and torch.equal(gl, wl)
    assert _failed_names(processes) == _failed_names(threads)
    assert "claim" in [s["name"] for s in processes.describe()]
    # the claim stage is internal, as the CPU path's: its time counts for the readers
    assert "claim" in [s.name for s in processes.stats().stages if s.internal]


def test_without_a_gpu_decoder_the_error_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu_decoders, "available", lambda: [])
    with pytest.raises(ConfigError, match=r"asyncflow\[gpu\].*decode='cpu'"):
        _gpu_decoders.choose(torch.device("cuda", 0))


def test_a_batch_whose_every_image_fails_late_is_skipped_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Images that pass the CPU side's checks but that neither decoder makes (cut inside
    their scan data, then closed with an end-of-image marker)."""
    (tmp_path / "a").mkdir()
    for i in range(6):
        data = P.jpeg(240, 180, seed=i)
        if i in (2, 3):  # the whole second batch
            data = data[: len(data) * 2 // 3] + P.EOI
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    stand_in = StandIn()
    monkeypatch.setattr(_folder, "decode_path",
                        lambda d, dev: (torch.device("cpu"), stand_in, "stand-in"))
    kw = {"batch_size": 2, "size": 24, "max_failures": 2}
    pipe = image.folder(tmp_path, decode="cuda", **kw)
    got = _batches(pipe)
    assert [len(y) for _, y in got] == [2, 2]
    assert _failed_names(pipe) == ["2.jpg", "3.jpg"]
    resumed = {}
    for decode in ("cuda", "cpu"):
        first = image.folder(tmp_path, decode=decode, workers="threads", **kw)
        it = iter(first)
        next(it)
        state = first.state_dict()
        it.close()
        again = image.folder(tmp_path, decode=decode, workers="threads", **kw)
        again.load_state_dict(state)
        resumed[decode] = [y.tolist() for _, y in _batches(again)]
    assert resumed["cuda"] == resumed["cpu"] == [[0, 0]]
    with pytest.raises(PipelineError):
        _batches(image.folder(tmp_path, decode="cuda", batch_size=2, size=24,
                              max_failures=1))


def test_drop_last_drops_the_short_batch_as_on_the_cpu(gpu: dict, photos: Path) -> None:
    """Two epochs: the short batch's rows never reach a batch, and the next epoch starts."""
    kw = {"batch_size": 5, "size": 32, "train": True, "seed": 8, "normalize": False,
          "drop_last": True}  # 12 photos: 2 batches, and 2 left
    pipe = _folder_with(gpu, photos, **kw)
    cpu = image.folder(photos, decode="cpu", workers="threads", **kw)
    for _ in range(2):
        got, want = _batches(pipe), _batches(cpu)
        assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
        assert [len(y) for _, y in got] == [5, 5] and len(pipe) == 2


def test_the_journal_names_the_decoder_and_rebuild_says_it_is_within_tolerance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncflow as af

    _mixed(tmp_path / "tree")
    stand_in = StandIn()
    monkeypatch.setattr(_folder, "decode_path",
                        lambda d, dev: (torch.device("cpu"), stand_in, "stand-in"))
    kw = {"batch_size": 3, "size": 32, "train": True, "seed": 6, "normalize": False,
          "max_failures": 3, "decode": "cuda", "workers": "threads"}
    pipe = image.folder(tmp_path / "tree", **kw)
    delivered = list(pipe.journal(tmp_path / "journal"))
    failed = []
    for step, (images, labels) in enumerate(delivered):
        record = af.explain(tmp_path / "journal", epoch=0, step=step)
        assert record.extra["decoder"] == stand_in.name
        assert [item[1] for item in record.items] == labels.tolist()
        failed += [f.item for f in record.failed]
        with pytest.warns(af.RebuildWarning, match="within"):
            again_images, again_labels = af.rebuild(pipe, record)
        assert torch.equal(again_labels, labels)
        assert _levels(again_images, images).max() <= 4.0
    assert sorted(Path(p).name for p in failed) == ["empty.jpg", "text.jpg", "truncated.jpg"]


def test_the_gpu_stage_settles_the_batches_it_dropped_with_the_outputs_around_them() -> None:
    """Batch ``n`` in is batch ``n`` out less the dropped ones (every row failed): the settled
    inputs are the dropped ones and those that made the settled outputs."""
    rng = random.Random(3)
    for _ in range(2000):
        count = rng.randint(1, 20)
        dropped = sorted(rng.sample(range(count), rng.randint(0, min(count, 6))))
        made = [i for i in range(count) if i not in dropped]  # output ordinal -> input
        settled = [o for o in range(len(made)) if rng.random() < 0.5]
        node = SimpleNamespace(_lock=threading.Lock(), _dropped=dropped)
        got = _gpu.GpuDecodeNode.settled_inputs(node, Span.of(0, settled))  # type: ignore[arg-type]
        assert got == Span.of(0, [*dropped, *(made[o] for o in settled)])
