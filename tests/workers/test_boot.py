"""What worker processes boot from (``_boot.py``): large buffers shared, not copied."""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np
import pytest

from asyncflow import Pipeline, Processes
from asyncflow.workers import _segments

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(60)]


def _my_segments() -> list[str]:
    return [n for n in os.listdir(_segments.SHM_DIR) if n.startswith(f"asyncflow-{os.getpid()}-")]


class HoldsArray:
    """A function holding 1 MiB (an in-memory Dataset's data): reports its worker's copy."""

    def __init__(self) -> None:
        self.data = np.zeros(1 << 20, dtype=np.uint8)

    def __call__(self, x: int) -> tuple[int, int, str]:
        first = int(self.data[0])
        self.data[0] = 1  # this worker's copy only
        base: Any = self.data
        while isinstance(base, np.ndarray | memoryview):
            base = base.base if isinstance(base, np.ndarray) else base.obj
        return os.getpid(), first, type(base).__name__


def test_a_functions_large_buffers_are_mapped_from_one_segment_not_copied() -> None:
    fn = HoldsArray()
    pipe = Pipeline(range(40)).map(fn, concurrency=2, workers="processes")
    assert _my_segments() == []  # checking that fn pickles wrote nothing
    out = list(pipe)
    # Each worker's array lies on a mapping of the one segment the pool wrote (as bytes, each
    # worker held the payload, its inner pickle and a private copy: 3 MiB, not shared)...
    assert {kind for _, _, kind in out} == {"mmap"}
    # ... copy-on-write: each worker starts from the parent's data and sees only its own writes
    pids = {pid for pid, _, _ in out}
    assert sum(first == 0 for _, first, _ in out) == len(pids) == 2
    assert fn.data[0] == 0
    assert _my_segments() == []  # the pool's sweep removed the boot segment


def test_a_persistent_pool_keeps_its_boot_segment_until_it_shuts_down() -> None:
    pipe = Pipeline(range(6)).map(HoldsArray(), concurrency=2,
                                  workers=Processes(persistent=True))
    for _ in range(2):  # the second epoch's workers are the first's
        assert {kind for _, _, kind in pipe} == {"mmap"}
    # the array's segment stays between epochs, for a worker started again after a death
    assert [n for n in _my_segments() if not n.endswith("status")] != []
    del pipe
    gc.collect()
    assert _my_segments() == []


def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process ('' for anonymous memory)."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            span, *rest = line.split()
            low, high = (int(a, 16) for a in span.split("-"))
            if low <= address < high:
                return rest[4] if len(rest) > 4 else ""
    return ""


class TensorRows:
    """A torch Dataset holding 1 MiB of tensor: each item says where its worker's copy lies."""

    def __init__(self) -> None:
        import torch

        self.data = torch.zeros(1 << 18, dtype=torch.float32)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> str:
        return _mapped_file(self.data.data_ptr())


def test_a_datasets_tensor_is_mapped_by_the_dataloaders_workers_not_copied() -> None:
    pytest.importorskip("torch")
    from asyncflow import DataLoader

    # the forkserver's boot payload (forked workers share the parent's pages instead)
    loader = DataLoader(TensorRows(), batch_size=2, num_workers=2, workers="processes",
                        collate_fn=list, multiprocessing_context="forkserver")
    where = [path for batch in loader for path in batch]
    assert len(where) == 4
    assert all(os.path.basename(p).startswith("asyncflow-") for p in where), where
    del loader
    gc.collect()


def test_without_room_in_shared_memory_the_buffers_travel_in_the_payload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(path: str, data: memoryview) -> int:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(_segments, "_write_segment", full)
    fn = HoldsArray()
    out = list(Pipeline(range(10)).map(fn, concurrency=2, workers="processes"))
    assert {kind for _, _, kind in out} == {"bytearray"}  # a copy per worker, writable
    assert sum(first == 0 for _, first, _ in out) == len({pid for pid, _, _ in out})
    assert _my_segments() == []
