"""``FloatBatches``: float buffers reused only once nothing views them, and a release that waits
for one is woken as the last view goes, not by polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from asyncflow.image import _float_batches
from asyncflow.image._float_batches import FLOAT_POOL, FloatBatches

SHAPE = (2, 3, 4, 4)
# Views that outlive the batch tensor, or keep it: either holds the buffer.
VIEWS: dict[str, Callable[[torch.Tensor], object]] = {
    "tensor view": lambda t: t[1],
    "NumPy view": lambda t: t.numpy()[1:],
}


def _batches() -> FloatBatches:
    return FloatBatches(SHAPE, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def _images(value: int) -> torch.Tensor:
    return torch.full(SHAPE, value, dtype=torch.uint8)


@pytest.mark.parametrize("view", VIEWS)
def test_a_buffer_still_viewed_is_never_written_over(
    view: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_float_batches, "PATIENCE", 0.0)  # a wait runs out at once
    floats = _batches()
    first = floats.normalize(_images(1))
    kept, ptr = VIEWS[view](first), first.data_ptr()
    want = torch.as_tensor(kept).clone()
    del first  # a tensor view outlives the batch tensor; a NumPy view keeps it
    second = floats.normalize(_images(2))
    del second  # its buffer is free again
    third = floats.normalize(_images(3))  # the free buffer, not the viewed one
    fourth = floats.normalize(_images(4))  # both kept ones held: the wait runs out, one more
    assert ptr not in (third.data_ptr(), fourth.data_ptr())
    assert torch.equal(torch.as_tensor(kept), want)
    stats = floats.stats()
    assert (stats.buffers, stats.spares, floats.waits) == (FLOAT_POOL + 1, 0, 1)


@pytest.mark.parametrize("view", VIEWS)
def test_letting_go_of_the_last_view_wakes_the_waiting_release_once(
    view: str, monkeypatch: pytest.MonkeyPatch, leak_check: None,
) -> None:
    monkeypatch.setattr(_float_batches, "PATIENCE", 60.0)  # only the release ends the wait
    floats = _batches()
    first = floats.normalize(_images(1))
    second = floats.normalize(_images(2))  # held to the end: the viewed buffer is the one
    kept, ptr = VIEWS[view](first), first.data_ptr()
    del first
    looks = 0  # how often the release looked for a free buffer
    waiting = threading.Event()
    free = floats._free

    def counted() -> bool:
        nonlocal looks
        looks += 1
        if looks == 2:  # the wait's first look: it blocks next
            waiting.set()
        return free()

    monkeypatch.setattr(floats, "_free", counted)
    got: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: got.append(floats.normalize(_images(3))),
                              daemon=True)
    thread.start()
    assert waiting.wait(10)
    time.sleep(0.05)  # room for a poller to look again while nothing was let go
    del kept
    thread.join(10)
    assert not thread.is_alive(), "letting go of the last view did not wake the release"
    assert looks == 3  # before the wait, as it began, and once woken
    assert got[0].data_ptr() == ptr and floats.waits == 1
    assert floats.stats().buffers == FLOAT_POOL and second.data_ptr() != ptr
