"""Where ``image.folder`` normalizes: decoders write uint8 rows; a batch becomes float32 when it
is released (recycled float buffers), or on its device after a uint8 copy (issue 23)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asyncflow import Pipeline, image
from asyncflow.image import _folder
from asyncflow.image._slots import FLOAT_POOL, BatchAssembler

from ._pictures import write_tree

Batches = list[tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 14, "dog": 13, "ant": 12})
    return root


def _batches(pipe: object) -> Batches:
    return [(x.clone(), y.clone()) for x, y in pipe]  # type: ignore[attr-defined]


def _in_kernel(monkeypatch: pytest.MonkeyPatch, tree: Path, **kw: object) -> Batches:
    """The same batches, normalized by the decoders as each float32 row is written (before)."""
    with monkeypatch.context() as m:
        m.setattr(_folder, "_NORMALIZE_IN_KERNEL", True)
        pipe = image.folder(tree, **kw)  # type: ignore[arg-type]
        assert pipe._assembler._np_dtype == np.float32
        return _batches(pipe)


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_rows_are_uint8_and_batches_equal_the_kernel_s_bit_for_bit(
    tree: Path, workers: str, monkeypatch: pytest.MonkeyPatch, leak_check: None,
) -> None:
    kw = {"batch_size": 4, "size": 24, "train": True, "seed": 5, "workers": workers,
          "decode_concurrency": 2}
    pipe = image.folder(tree, **kw)  # type: ignore[arg-type]
    assembler = pipe._assembler
    assert assembler._np_dtype == np.uint8 and assembler.dtype == torch.float32
    got = _batches(pipe)
    # every buffer rows were decoded into is a uint8 batch: a quarter of a float one
    stats = assembler.pool_stats()
    assert stats.buffers >= 1 and stats.allocated_bytes == stats.buffers * 4 * 3 * 24 * 24
    want = _in_kernel(monkeypatch, tree, **kw)
    assert len(got) == len(want) == 10
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert x.dtype == torch.float32 and x.is_contiguous()
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_a_failed_row_is_left_out_before_normalizing(tree: Path) -> None:
    (tree / "cat" / "005.jpg").write_bytes(b"not a jpeg")
    kw = {"batch_size": 4, "size": 16, "workers": "threads", "max_failures": 1}
    x_all = torch.cat([x for x, _ in _batches(image.folder(tree, **kw))])  # type: ignore[arg-type]
    u8 = torch.cat([x for x, _ in _batches(image.folder(tree, normalize=False, **kw))])  # type: ignore[arg-type]
    assert x_all.shape[0] == u8.shape[0] == 38
    torch.testing.assert_close(x_all, image.normalize(u8), atol=0, rtol=0)


def test_float_batches_are_recycled_yet_a_held_batch_is_never_overwritten(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=2, size=16, workers="threads")
    dropped = [x.clone() for x, _ in pipe]  # each batch let go as the next comes
    floats = pipe._assembler._floats.stats()
    assert floats.buffers <= FLOAT_POOL and floats.hits >= 10  # reused, not made afresh
    held = list(pipe)  # 20 batches held at once: more than the float pool keeps
    assert len(held) == len(dropped) == 20 > FLOAT_POOL
    for (x, _), y in zip(held, dropped, strict=True):
        assert torch.equal(x, y)
    assert len({x.data_ptr() for x, _ in held}) == 20  # none shares a buffer with another
    assert pipe._assembler._floats.stats().buffers <= FLOAT_POOL


def test_the_assembler_releases_floats_and_returns_its_uint8_buffer_at_once() -> None:
    assembler = BatchAssembler(2, 1, 1, count=2, dtype=torch.float32,
                               normalize=((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    released = []
    for pos in range(2):
        ticket, row = assembler.claim(0, pos, label=pos)
        assert row.dtype == np.uint8
        row.fill(255 * pos)
        released += assembler.arrived(ticket)
    del row  # the test's own view of the uint8 buffer
    [(images, _)] = released
    assert images.dtype == torch.float32 and images[:, 0, 0, 0].tolist() == [0.0, 1.0]
    assert assembler.pool_stats().in_use == 0  # the uint8 buffer is free for the next batch


def test_with_a_device_the_uint8_batch_is_copied_then_normalized_there(tree: Path) -> None:
    # "meta" stands in for CUDA (no GPU here): the same route, to_device(then=...)
    pipe = image.folder(tree, batch_size=4, size=16, workers="threads", device="meta")
    assert pipe._assembler.dtype == torch.uint8 and pipe._assembler.normalize is None
    assert [s["name"] for s in pipe.describe()][-1] == "to_device"
    out = list(pipe)
    assert len(out) == 10
    assert all(x.device.type == "meta" and x.dtype == torch.float32 for x, _ in out)


def test_to_device_s_then_runs_on_each_batch() -> None:
    pipe = Pipeline(range(3)).map(lambda i: torch.full((2,), i, dtype=torch.uint8))
    assert [t.tolist() for t in pipe.to_device("cpu", then=lambda t: t * 2)] == [
        [0, 0], [2, 2], [4, 4]]
    meta = list(pipe.to_device("meta", then=lambda t: t.float()))
    assert all(t.device.type == "meta" and t.dtype == torch.float32 for t in meta)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_equal_the_cpu_s(tree: Path) -> None:
    kw = {"batch_size": 4, "size": 24, "train": True, "seed": 5, "decode": "cpu"}
    cpu = _batches(image.folder(tree, **kw))  # type: ignore[arg-type]
    cuda = image.folder(tree, device="cuda", **kw)  # type: ignore[arg-type]
    assert cuda._assembler.dtype == torch.uint8
    got = [(x.cpu(), y.cpu()) for x, y in cuda]
    for (x, y), (wx, wy) in zip(got, cpu, strict=True):
        torch.testing.assert_close(x, wx, atol=1e-6, rtol=0)
        assert torch.equal(y, wy)
