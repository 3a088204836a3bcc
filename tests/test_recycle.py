"""The one buffer recycler: keys, limits, both ways a buffer comes back, stats.

The pinned pool's waits and fences are in tests/torch/test_pinned.py, through ``PinnedPool``."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from asyncflow._recycle import Recycler

Key = tuple[tuple[int, ...], str]


def arrays(limit: int = 2) -> Recycler[Key, np.ndarray]:
    return Recycler(lambda key, _: np.empty(*key), nbytes=lambda a: a.nbytes, limit=limit,
                    returned="unreferenced")


def test_an_unreferenced_buffer_is_reused_once_every_view_is_gone() -> None:
    pool = arrays()
    first = pool.acquire(((4, 3), "f4"))
    view, address = first[:2], first.ctypes.data
    del first
    second = pool.acquire(((4, 3), "f4"))
    assert second.ctypes.data != address  # the view still holds the first
    del view, second
    assert pool.acquire(((4, 3), "f4")).ctypes.data == address  # the first kept, first reused
    assert (pool.stats().hits, pool.stats().misses) == (1, 2)


def test_buffers_are_filed_by_key() -> None:
    pool = arrays()
    a = pool.acquire(((2,), "f4"))
    del a
    b = pool.acquire(((2,), "u1"))
    assert b.dtype == np.uint8 and pool.stats().misses == 2
    del b
    assert pool.acquire(((2,), "f4")).dtype == np.float32 and pool.stats().hits == 1


def test_beyond_the_limit_a_key_gets_spares_that_are_not_kept() -> None:
    pool = arrays(limit=2)
    held = [pool.acquire(((8,), "f8")) for _ in range(5)]
    stats = pool.stats()
    assert (stats.buffers, stats.misses, stats.spares, stats.in_use) == (2, 5, 3, 2)
    assert stats.allocated_bytes == 2 * 64
    assert [pool.owns(b) for b in held] == [True, True, False, False, False]
    del held
    assert pool.stats().in_use == 0


def test_a_released_buffer_serves_the_smallest_request_it_fits() -> None:
    pool: Recycler[str, bytearray] = Recycler(lambda _, n: bytearray(n), nbytes=len, limit=3)
    small, big = pool.acquire("k", 10), pool.acquire("k", 100)
    pool.release(big)
    pool.release(small)
    assert pool.acquire("k", 5) is small
    assert pool.acquire("k", 50) is big
    with pytest.raises(ValueError, match="not acquired"):
        pool.release(bytearray(3))


def test_a_key_at_its_limit_waits_for_a_release() -> None:
    pool: Recycler[str, bytearray] = Recycler(lambda _, n: bytearray(n), nbytes=len, limit=1)
    other = pool.acquire("other", 1)  # another key's buffer does not count against "k"
    first = pool.acquire("k", 1)
    got: list[bytearray] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire("k", 1)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive() and not got
    pool.release(first)
    waiter.join(5)
    assert got and got[0] is first
    pool.release(other)


def test_close_drops_what_is_free_and_later_releases() -> None:
    dropped: list[Any] = []
    pool: Recycler[str, bytearray] = Recycler(lambda _, n: bytearray(n), nbytes=len, limit=2,
                                              on_drop=dropped.append)
    kept, free = pool.acquire("k", 1), pool.acquire("k", 2)
    pool.release(free)
    pool.close()
    assert dropped == [free] and pool.stats().buffers == 1
    pool.release(kept)
    assert dropped == [free, kept] and pool.stats().buffers == 0
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire("k", 1)


def test_rejects_a_bad_limit_or_mode() -> None:
    with pytest.raises(ValueError):
        Recycler(lambda _, n: bytearray(n), nbytes=len, limit=0)
    with pytest.raises(ValueError):
        Recycler(lambda _, n: bytearray(n), nbytes=len, limit=1, returned="gc")  # type: ignore[arg-type]
