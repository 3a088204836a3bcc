"""Where ``image.folder`` normalizes: decoders write uint8 rows; a batch becomes float32 when it
is released (recycled float buffers), or on its device after a uint8 copy (issue 23)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncflow import Pipeline, image
from asyncflow.image import _float_batches, _folder
from asyncflow.image._float_batches import FLOAT_POOL, FLOAT_POOL_MAX
from asyncflow.image._listing import Sample
from asyncflow.image._slots import BatchAssembler

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


def test_float_batches_are_recycled_yet_a_held_batch_is_never_overwritten(
    tree: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_float_batches, "PATIENCE", 30.0)  # however loaded the machine
    pipe = image.folder(tree, batch_size=2, size=16, workers="threads")
    dropped = [x.clone() for x, _ in pipe]  # each batch let go as the next comes
    floats = pipe._assembler._floats.stats()
    # reused, not made afresh (a spare for the second of two batches the last row completes)
    assert floats.buffers == FLOAT_POOL and floats.hits + floats.spares == 18
    monkeypatch.setattr(_float_batches, "PATIENCE", 0.2)
    held = list(pipe)  # 20 batches held at once: more than the float pool keeps
    assert len(held) == len(dropped) == 20 > FLOAT_POOL
    for (x, _), y in zip(held, dropped, strict=True):
        assert torch.equal(x, y)
    assert len({x.data_ptr() for x, _ in held}) == 20  # none shares a buffer with another
    assert pipe._assembler._floats.stats().buffers <= FLOAT_POOL_MAX


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_two_float_batches_serve_a_slow_consumer(
    tree: Path, workers: str, monkeypatch: pytest.MonkeyPatch, leak_check: None,
) -> None:
    # The consumer's batch and the one waiting for it: the hand-off holds none besides
    # (it held two, and the stage a third made: four float batches with this consumer).
    monkeypatch.setattr(_float_batches, "PATIENCE", 30.0, raising=False)  # a loaded machine
    pipe = image.folder(tree, batch_size=2, size=16, workers=workers,  # type: ignore[arg-type]
                        decode_concurrency=2)
    assert pipe.describe()[-1]["buffer_bytes"] == 2 * (3 * 16 * 16 * 4 + 8)
    got = []
    for x, y in pipe:
        time.sleep(0.02)
        got.append((x.clone(), y.clone()))
    assert len(got) == 20
    floats = pipe._assembler._floats.stats()
    assert floats.buffers == FLOAT_POOL and floats.hits + floats.spares == 18
    assert floats.spares <= 1  # the second of two batches the last row completes
    again = _batches(pipe)  # a fast consumer: the same batches
    assert all(torch.equal(x, wx) for (x, _), (wx, _) in zip(got, again, strict=True))


def test_a_consumer_holding_two_batches_gets_a_third_float_buffer(
    tree: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_float_batches, "PATIENCE", 1.0)  # a wait that runs out: one more
    pipe = image.folder(tree, batch_size=2, size=16, workers="threads")
    want = _batches(pipe)
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, batch in enumerate(pipe):
        if len(held) == 2:
            assert torch.equal(held[0][0], want[i - 2][0])  # kept two batches back: intact
        held = [*held[-1:], batch]  # the previous batch kept while the next comes
    floats = pipe._assembler._floats
    assert floats.stats().buffers == FLOAT_POOL + 1  # kept: one more, not one per batch
    assert floats.waits >= 1  # one wait ran out: then one more buffer was kept


def test_one_float_batch_is_released_per_row_while_rows_are_to_come() -> None:
    assembler = BatchAssembler(2, 1, 1, count=6, dtype=torch.float32,
                               normalize=((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    tickets = {}
    for pos in range(6):
        tickets[pos], row = assembler.claim(0, pos, label=pos)
        row.fill(pos)
    del row
    for pos in (2, 3, 4, 1):
        assert assembler.arrived(tickets[pos]) == []
    # batches 0 and 1 are complete: one is released, the other waits for the next row
    [(first, labels)] = assembler.arrived(tickets[0])
    assert labels.tolist() == [0, 1] and first[:, 0, 0, 0].tolist() == pytest.approx([0, 1 / 255])
    # the last row: nothing more will come, so every complete batch goes
    rest = assembler.arrived(tickets[5])
    assert [labels.tolist() for _, labels in rest] == [[2, 3], [4, 5]]


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


def test_the_claim_stage_waits_while_a_batch_is_ahead_of_the_oldest_one_open() -> None:
    # With processes the claims ran ahead by as many rows as the queues between them and the
    # consumer held (64 rows in the rows queue alone): a lagging consumer held that many slabs.
    assembler = BatchAssembler(1, 1, 1, count=3, ahead=1)
    assembler._released = _CountedWaits(assembler._lock)
    claim = _folder._ClaimRows(assembler)
    assert claim.asyncflow_inline is False  # it waits: never on the run's loop
    [first] = claim([Sample("a", 0, epoch=0, pos=0, run=0, sample=0)])
    claimed = threading.Event()
    thread = threading.Thread(
        target=lambda: (claim([Sample("b", 1, epoch=0, pos=1, run=0, sample=1)]),
                        claimed.set()))
    thread.start()
    assert not claimed.wait(0.3)  # batch 1 is `ahead` past batch 0, not complete yet
    assert assembler.arrived(first.ticket) != []
    assert claimed.wait(5)
    thread.join()
    assert assembler.stalls == 0
    assert assembler._released.waits == 1  # woken by the release, not polling meanwhile


class _CountedWaits(threading.Condition):
    """A condition that counts how often a thread waited on it."""

    waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)
