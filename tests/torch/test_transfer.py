"""to_device: the CPU-side contract everywhere, and the CUDA behaviour where there is a GPU."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import pytest
import torch

from asyncflow import ConfigError, Pipeline
from asyncflow.torch import to_device
from asyncflow.torch._pinned import held_bytes
from asyncflow.torch._transfer import DeviceTransfer, flatten, resolve_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Pair(NamedTuple):
    left: torch.Tensor
    right: object


# -- everywhere ---------------------------------------------------------------------------


def test_a_batch_comes_apart_into_its_tensors_and_back_keeping_types_and_the_rest() -> None:
    arr = np.arange(3)
    batch = {
        "x": torch.zeros(2),
        "nested": [torch.ones(1), (torch.full((1,), 2.0), "label", 3)],
        "pair": Pair(torch.full((1,), 4.0), None),
        "od": OrderedDict(y=torch.full((1,), 5.0)),
        "array": arr,
    }
    leaves, rebuild = flatten(batch)
    assert [float(t.sum()) for t in leaves] == [0.0, 1.0, 2.0, 4.0, 5.0]
    again = rebuild([t + 10 for t in leaves])
    assert again["x"].tolist() == [10.0, 10.0]
    assert isinstance(again["nested"], list) and isinstance(again["nested"][1], tuple)
    assert again["nested"][1][1:] == ("label", 3)
    assert isinstance(again["pair"], Pair) and again["pair"].right is None
    assert isinstance(again["od"], OrderedDict) and again["od"]["y"].item() == 15.0
    assert again["array"] is arr


def test_a_bare_tensor_and_a_plain_value_come_apart_too() -> None:
    leaves, rebuild = flatten(torch.ones(2))
    assert len(leaves) == 1 and rebuild([torch.zeros(2)]).tolist() == [0.0, 0.0]
    leaves, rebuild = flatten("text")
    assert leaves == [] and rebuild([]) == "text"


def test_cpu_is_a_no_op() -> None:
    pipe = Pipeline(range(3)).map(torch.ones)
    assert to_device(pipe, "cpu") is pipe
    assert pipe.to_device(torch.device("cpu")) is pipe


def test_cuda_without_cuda_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pipe = Pipeline(range(3))
    with pytest.raises(ConfigError, match="CUDA is not available"):
        pipe.to_device("cuda")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        to_device(pipe, 0)


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", 3.5])
def test_malformed_devices_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError):
        resolve_device(bad)  # type: ignore[arg-type]


def test_bad_pool_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="pool_size"):
        to_device(Pipeline(range(3)), "cpu", pool_size=0)


def test_other_device_types_get_a_plain_copy_stage() -> None:
    out = list(to_device(Pipeline(range(2)).map(lambda i: Pair(torch.ones(i), i)), "meta"))
    assert [p.left.device.type for p in out] == ["meta", "meta"]
    assert [p.right for p in out] == [0, 1]


# -- on a GPU ------------------------------------------------------------------------------


def _batch(i: int) -> dict[str, object]:
    """A batch whose every value can be recomputed on the GPU from ``i`` alone."""
    base = torch.arange(64 * 1024, dtype=torch.float32).reshape(64, 1024) + i
    return {
        "x": base,
        "t": base[:, :16].t(),  # non-contiguous
        "y": torch.full((7,), i, dtype=torch.int64),
        "flag": torch.tensor([i % 2 == 0]),
        "pair": Pair(torch.full((3,), float(i)), f"item-{i}"),
        "i": i,
    }


@pytest.mark.gpu
@needs_cuda
def test_thousand_batches_equal_their_source_while_the_consumer_writes_in_place() -> None:
    held = held_bytes()
    dev = torch.device("cuda", torch.cuda.current_device())
    ref = torch.arange(64 * 1024, dtype=torch.float32, device=dev).reshape(64, 1024)
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    kept = []
    seen = 0
    pipe = Pipeline(range(1000)).map(_batch, concurrency=4).to_device("cuda")
    for batch in pipe:
        i = batch["i"]
        assert i == seen and batch["pair"].right == f"item-{i}"
        assert batch["x"].device == dev and batch["t"].shape == (16, 64)
        # The consumer's stream lags far behind the copies: any early reuse of memory, or a
        # read before the copy landed, would show up as a mismatch.
        torch.cuda._sleep(200_000)
        bad += (batch["x"] != ref + i).sum()
        bad += (batch["t"] != (ref + i)[:, :16].t()).sum()
        bad += (batch["y"] != i).sum() + (batch["flag"] != (i % 2 == 0)).sum()
        bad += (batch["pair"].left != float(i)).sum()
        batch["x"].mul_(-1)  # the consumer owns the batch: in-place writes are fine
        batch["y"].fill_(-7)
        if i % 100 == 0:
            kept.append((i, batch))
        seen += 1
    torch.cuda.synchronize()
    assert seen == 1000
    assert bad.item() == 0
    for i, batch in kept:
        assert torch.equal(batch["x"], -(ref + i))
        assert bool((batch["y"] == -7).all())
    assert held_bytes() == held  # the run ended: every pinned buffer was freed


@pytest.mark.gpu
@needs_cuda
async def test_async_for_delivers_ready_batches() -> None:
    held = held_bytes()
    pipe = Pipeline(range(50)).map(_batch).to_device("cuda")
    total = 0
    async for batch in pipe:
        assert torch.equal(batch["y"].cpu(), torch.full((7,), batch["i"]))
        total += 1
    assert total == 50 and held_bytes() == held


@pytest.mark.gpu
@needs_cuda
def test_break_frees_the_pinned_buffers() -> None:
    held = held_bytes()
    with Pipeline(range(1000)).map(_batch).to_device("cuda").open() as run:
        for n, _ in enumerate(run):
            if n == 5:
                break
        assert held_bytes() > held
    assert held_bytes() == held


@pytest.mark.gpu
@needs_cuda
def test_blocking_copies_tensors_already_on_the_device_and_pinned_sources() -> None:
    on_gpu = torch.ones(4, device="cuda")
    pinned = torch.arange(5).pin_memory()
    pipe = Pipeline([0]).map(lambda _: (on_gpu, pinned, "s")).to_device("cuda", non_blocking=False)
    [(a, b, s)] = list(pipe)
    assert a is on_gpu
    assert b.is_cuda and b.tolist() == [0, 1, 2, 3, 4]
    assert s == "s"


@pytest.mark.gpu
@needs_cuda
def test_the_pool_is_bounded_and_reused() -> None:
    transfer = DeviceTransfer(resolve_device("cuda"), pool_size=2)
    try:
        outs = [transfer.receive(transfer.send(_batch(i))) for i in range(50)]
        stats = transfer.pool.stats()
        assert stats.buffers <= 2 and stats.misses <= 2 and stats.hits >= 48
        torch.cuda.synchronize()
        assert [int(o["y"][0]) for o in outs] == list(range(50))
    finally:
        transfer.close()
    assert transfer.pool.stats().buffers == 0


def _timed(fn: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@pytest.mark.gpu
@needs_cuda
def test_copies_overlap_a_matmul_loop_on_the_default_stream() -> None:
    n, mb = 24, 64
    sources = [torch.full((mb << 18,), float(i)).pin_memory() for i in range(n)]
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    pipe = Pipeline(sources).to_device("cuda")

    def copies_only() -> None:
        for batch in pipe:
            batch[:1].add_(1)

    copies_only()  # warm up CUDA, the allocator and cuBLAS
    a @ a
    copy_s = _timed(copies_only)
    one_mm = _timed(lambda: [a @ a for _ in range(20)]) / 20
    per_batch = max(1, round(copy_s / n / one_mm))

    def compute_only() -> None:
        for _ in range(n * per_batch):
            a @ a

    def both() -> None:
        for batch in pipe:
            for _ in range(per_batch):
                a @ a
            batch[:1].add_(1)

    compute_s = _timed(compute_only)
    both_s = _timed(both)
    hidden = (copy_s + compute_s - both_s) / min(copy_s, compute_s)
    print(f"copies {copy_s * 1e3:.1f} ms, compute {compute_s * 1e3:.1f} ms, "
          f"both {both_s * 1e3:.1f} ms, overlap {hidden:.0%}")
    assert both_s < 0.8 * (copy_s + compute_s), (copy_s, compute_s, both_s)


class _SlowTransfer:
    """A stand-in for :class:`DeviceTransfer` (no CUDA here): each send takes 10 ms."""

    def __init__(self, device: object, **_: object) -> None:
        pass

    def send(self, batch: object) -> object:
        time.sleep(0.01)
        return batch

    def receive(self, item: object) -> object:
        return item

    def close(self) -> None:
        pass


def test_the_transfer_stage_s_busy_time_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from asyncflow.pipeline import CustomSpec
    from asyncflow.torch import _transfer

    monkeypatch.setattr(_transfer, "DeviceTransfer", _SlowTransfer)
    spec = CustomSpec(
        label="to_device", concurrency=1, items_per_output=1, terminal=True,
        factory=functools.partial(_transfer._TransferNode, device=torch.device("cpu"),
                                  non_blocking=True, pool_size=2),
    )
    pipe = Pipeline(range(20)).with_stage(spec)
    assert list(pipe) == list(range(20))
    stats = pipe.stats()
    stage = stats["to_device"]
    assert stage.busy_seconds >= 20 * 0.009
    assert stage.mean_seconds_per_item >= 0.009 and stage.utilization > 0.5
    assert (stage.items_in, stage.items_out, stage.chunks) == (20, 20, 20)
    assert stats.bottleneck == "to_device"
