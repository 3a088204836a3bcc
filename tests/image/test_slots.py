"""The batch assembler: rows decoded in any order, whole batches released in order."""

from __future__ import annotations

import gc
import os
import random
import threading
import weakref

import torch

from asyncflow.image._rows import SharedSlabs
from asyncflow.image._slots import BatchAssembler, Ticket
from asyncflow.pipeline.shm import SHM_DIR


def _decode(assembler: BatchAssembler, run: int, pos: int) -> Ticket:
    ticket, row = assembler.claim(run, pos, label=pos)
    row.fill(pos % 251)
    return ticket


def test_batches_come_out_whole_and_in_order_whatever_the_arrival_order() -> None:
    assembler = BatchAssembler(4, 2, 3, count=10)
    tickets = [_decode(assembler, 0, pos) for pos in range(10)]
    random.Random(0).shuffle(tickets)
    released = [b for t in tickets for b in assembler.arrived(t)]
    assert [labels.tolist() for _, labels in released] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for images, labels in released:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 2, 3)
        assert images[:, 0, 0, 0].tolist() == labels.tolist()
    assert 0 not in assembler._runs  # every batch is out: the run is forgotten


def test_a_failed_row_shortens_only_its_batch() -> None:
    assembler = BatchAssembler(4, 1, 1, count=8)
    tickets = [_decode(assembler, 0, pos) for pos in range(8)]
    out = []
    for t in tickets:
        out += assembler.arrived(t, ok=t.row != 1 or t.number != 0)
    assert [labels.tolist() for _, labels in out] == [[0, 2, 3], [4, 5, 6, 7]]
    assert out[0][0][:, 0, 0, 0].tolist() == [0, 2, 3]


def test_a_batch_of_failures_releases_nothing_and_does_not_block() -> None:
    assembler = BatchAssembler(2, 1, 1, count=4)
    tickets = [_decode(assembler, 0, pos) for pos in range(4)]
    out = [b for t in tickets for b in assembler.arrived(t, ok=t.number != 0)]
    assert [labels.tolist() for _, labels in out] == [[2, 3]]


def test_drop_last() -> None:
    assembler = BatchAssembler(4, 1, 1, count=6, drop_last=True)
    out = [b for pos in range(6) for b in assembler.arrived(_decode(assembler, 0, pos))]
    assert [labels.tolist() for _, labels in out] == [[0, 1, 2, 3]]


def test_runs_never_share_buffers() -> None:
    assembler = BatchAssembler(4, 1, 1, count=4)
    _, a = assembler.claim(0, 0, 0)
    _, b = assembler.claim(1, 0, 0)
    a.fill(1)
    b.fill(2)
    assert a[0, 0, 0] == 1 and b[0, 0, 0] == 2


def test_concurrent_claims_and_out_of_order_arrivals() -> None:
    assembler = BatchAssembler(8, 1, 1, count=64, dtype=torch.float32, ahead=64)
    tickets: list[Ticket] = []
    lock = threading.Lock()

    def work(start: int) -> None:
        for pos in range(start, 64, 4):
            t = _decode(assembler, 0, pos)
            with lock:
                tickets.append(t)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = [b for t in tickets for b in assembler.arrived(t)]
    assert torch.cat([labels for _, labels in out]).tolist() == list(range(64))
    assert torch.cat([images for images, _ in out])[:, 0, 0, 0].tolist() == list(range(64))


def test_decoding_too_far_ahead_waits_for_the_head() -> None:
    assembler = BatchAssembler(1, 1, 1, count=10, ahead=2)
    first = _decode(assembler, 0, 0)
    _decode(assembler, 0, 1)
    claimed = threading.Event()

    def far() -> None:
        _decode(assembler, 0, 2)  # two batches past the unreleased head: waits
        claimed.set()

    thread = threading.Thread(target=far)
    thread.start()
    assert not claimed.wait(0.2)
    assert len(assembler.arrived(first)) == 1
    assert claimed.wait(2.0)
    thread.join()


def test_buffers_are_reused_only_once_nothing_holds_them() -> None:
    assembler = BatchAssembler(2, 2, 2, count=100, dtype=torch.float32)

    def batch(start: int) -> torch.Tensor:
        tickets = [_decode(assembler, 0, pos) for pos in (start, start + 1)]
        (images, _), = [b for t in tickets for b in assembler.arrived(t)]
        return images

    images = batch(0)
    first = images.data_ptr()
    view = images[1]  # the consumer keeps a view: the buffer stays theirs
    del images
    held = batch(2)
    assert held.data_ptr() != first
    as_numpy = held.numpy()
    del view, held
    again = batch(4)
    assert again.data_ptr() == first  # recycled: nothing referred to it any more
    assert again[:, 0, 0, 0].tolist() == [4, 5]
    del again
    other = batch(6)
    assert other.data_ptr() != as_numpy.ctypes.data


def test_the_pool_is_bounded() -> None:
    assembler = BatchAssembler(1, 1, 1, count=50, pool=3)
    kept = [assembler.arrived(_decode(assembler, 0, i))[0][0] for i in range(10)]
    assert len({t.data_ptr() for t in kept}) == 10
    stats = assembler.pool_stats()
    assert (stats.buffers, stats.misses, stats.spares) == (3, 10, 7)


def test_shared_slabs_spares_go_when_complete_kept_ones_with_the_assembler() -> None:
    slabs = SharedSlabs()
    prefix = os.path.basename(slabs.prefix)

    def on_disk() -> set[str]:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}

    assembler = BatchAssembler(1, 1, 1, count=5, pool=2, slabs=slabs)
    names = [assembler.claim_shared(0, pos, label=pos)[1] for pos in range(4)]
    assert len(set(names)) == 4 and on_disk() == set(names)  # 2 kept, 2 spares, all in use
    held = [b for pos in range(4) for b in assembler.arrived(Ticket(0, pos, 0, pos))]
    assert on_disk() == set(names[:2])  # the spares' batches are complete: unlinked
    del held
    _, again = assembler.claim_shared(0, 4, label=4)
    assert again == names[0]  # a kept slab, recycled: no new file
    assert on_disk() == set(names[:2])
    gone = weakref.ref(assembler)
    gc.disable()  # no reference cycle may keep the slabs past the assembler
    try:
        del assembler, slabs
        assert gone() is None and on_disk() == set()
    finally:
        gc.enable()
