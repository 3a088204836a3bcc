"""The pinned-buffer pool, on the CPU: bounds, reuse, fences, close."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from asyncflow import ConfigError
from asyncflow.torch import PinnedPool
from asyncflow.torch._pinned import held_bytes


class FakeFence:
    """A fence the test completes by hand; ``synchronize`` completes it (as the GPU would)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def cpu_pool(max_buffers: int = 2, granularity: int = 64) -> PinnedPool:
    return PinnedPool(
        max_buffers, granularity=granularity, allocate=lambda n: torch.empty(n, dtype=torch.uint8)
    )


def test_held_bytes_counts_every_pool_until_it_closes_or_dies() -> None:
    before = held_bytes()
    pool = cpu_pool(max_buffers=3)
    pool.release(pool.acquire(100))
    pool.release_after(pool.acquire(200), FakeFence())
    assert held_bytes() == before + 128 + 256
    pool.close()
    assert held_bytes() == before
    other = cpu_pool()
    other.acquire(10)
    del other
    gc.collect()
    assert held_bytes() == before


def test_acquire_rounds_up_and_reuses_released_buffers() -> None:
    pool = cpu_pool()
    a = pool.acquire(100)
    assert len(a) == 128
    pool.release(a)
    b = pool.acquire(50)
    assert b.data_ptr() == a.data_ptr()
    stats = pool.stats()
    assert (stats.hits, stats.misses, stats.buffers, stats.in_use) == (1, 1, 1, 1)
    pool.release(b)
    pool.close()


def test_picks_the_smallest_free_buffer_that_fits() -> None:
    pool = cpu_pool(max_buffers=3)
    small, big = pool.acquire(64), pool.acquire(640)
    pool.release(big)
    pool.release(small)
    assert pool.acquire(10).data_ptr() == small.data_ptr()
    assert pool.acquire(100).data_ptr() == big.data_ptr()


def test_a_buffer_returns_only_when_its_fence_completes() -> None:
    pool = cpu_pool(max_buffers=2)
    fence_a, fence_b = FakeFence(), FakeFence()
    a = pool.acquire(64)
    pool.release_after(a, fence_a)
    b = pool.acquire(64)
    assert b.data_ptr() != a.data_ptr()  # a is pending: a second buffer was made
    pool.release_after(b, fence_b)
    assert pool.stats().pending == 2
    fence_b.done = True  # completes out of order: a, the oldest, is still pending
    fence_a.done = True
    c = pool.acquire(64)
    assert c.data_ptr() == a.data_ptr()
    assert fence_a.waited == 0


def test_a_full_pool_waits_for_the_oldest_fence() -> None:
    pool = cpu_pool(max_buffers=1)
    fence = FakeFence()
    a = pool.acquire(64)
    pool.release_after(a, fence)
    b = pool.acquire(64)
    assert fence.waited == 1
    assert b.data_ptr() == a.data_ptr()
    assert pool.stats().buffers == 1


def test_a_full_pool_waits_for_another_threads_release() -> None:
    pool = cpu_pool(max_buffers=1)
    a = pool.acquire(64)
    got: list[torch.Tensor] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(64)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive() and not got
    pool.release(a)
    waiter.join(5)
    assert got and got[0].data_ptr() == a.data_ptr()


def test_too_small_free_buffers_are_replaced_not_added() -> None:
    pool = cpu_pool(max_buffers=1)
    pool.release(pool.acquire(64))
    big = pool.acquire(1000)
    assert len(big) == 1024
    stats = pool.stats()
    assert (stats.buffers, stats.allocated_bytes) == (1, 1024)


def test_close_waits_for_pending_copies_and_frees_everything() -> None:
    pool = cpu_pool(max_buffers=3)
    fence = FakeFence()
    pool.release_after(pool.acquire(64), fence)
    pool.release(pool.acquire(64))
    held = pool.acquire(64)
    pool.close()
    assert fence.waited == 1
    assert pool.stats().allocated_bytes == 64  # only the one still held
    pool.release(held)
    assert pool.stats().buffers == 0
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)


def test_rejects_foreign_buffers_and_double_release() -> None:
    pool = cpu_pool()
    buf = pool.acquire(1)
    pool.release(buf)
    with pytest.raises(ValueError):
        pool.release(buf)
    with pytest.raises(ValueError):
        pool.release(torch.empty(64, dtype=torch.uint8))


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError):
        PinnedPool(0)
    with pytest.raises(ConfigError):
        PinnedPool(2, granularity=0)


def test_default_allocation_is_pinned_where_cuda_exists() -> None:
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")
    with PinnedPool(1) as pool:
        buf = pool.acquire(10)
        assert buf.is_pinned()
        pool.release(buf)
