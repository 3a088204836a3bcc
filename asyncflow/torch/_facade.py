"""The DataLoader facade as its helpers see it: what ``_copies``, ``_draws``, ``_iterable``
and ``_layout`` read and write of the loader they are given.

``_loader.DataLoader`` is the one implementation. Typing the helpers by this protocol rather
than by the class keeps imports pointing one way: ``_loader.py`` imports the helpers, and
none of them imports it back.
"""

from __future__ import annotations

from typing import Any, Protocol

from ._state import LoaderState

__all__ = ["Loader"]


class Loader(Protocol):
    """An ``asyncflow.DataLoader``, as its helper modules use it."""

    # torch's DataLoader attributes, as torch's own code reads them
    dataset: Any
    batch_size: Any
    sampler: Any
    generator: Any
    collate_fn: Any
    drop_last: Any
    timeout: Any
    worker_init_fn: Any
    prefetch_factor: Any
    persistent_workers: Any
    pin_memory: Any
    pin_memory_device: Any
    multiprocessing_context: Any
    _dataset_kind: Any
    _IterableDataset_len_called: Any
    # asyncflow's options: num_workers None means "settled at each read"
    num_workers: Any
    device: Any
    max_failures: int | float
    workers: str
    # asyncflow's state (see DataLoader.__init__)
    _state: LoaderState
    _worker_seed: int
    _restore_main: Any
    _thread_fetches: list[Any]
    _copy: Any
    _kept_alive: bool
    _sent_digest: bytes | None
    _iterable: Any

    def __len__(self) -> int: ...

    def _samplers(self) -> tuple[Any, Any]: ...

    def _ordered(self) -> bool: ...
