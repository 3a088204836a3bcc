"""Replay a cache: items rebuilt from the mapped fields, in order or shuffled by index.

A cache of batches is batched again to the upstream batch size (its largest batch's: a
shorter one lost failed rows, or ends the pass); without failed rows, the last batch is short
exactly when upstream's was (a cache written from ``drop_last=True`` batches holds a whole
number of batches). In order, each batch is a slice of the mapping, handed out without a copy;
shuffled, each batch is gathered from its rows into a buffer, one copy (buffers are reused
once the consumer has let go of them). A cache of lists (``Pipeline.batch()`` output) yields
lists of samples again.

A batch that must be copied can be handed out as a :class:`Deferred` copy instead, which
:func:`finish` makes when the consumer asks for the batch, in the consumer's thread. A
shuffled replay moves memory and nothing else, so overlapping it with the consumer gains
nothing and costs much: on this project's two-core benchmark machine, a consumer that copies
each batch on got 45-56% of the memory bandwidth with batches copied on demand, and 25-29%
with batches copied ahead on the run's thread (the same rounds, interleaved). Two copies at
once compete for one memory bus and for the cores (torch runs a team of OpenMP threads per
calling thread), and a batch copied ahead has left the CPU cache by the time the consumer
reads it, where one copied on demand is read from the cache. Copied on demand, two buffers
take turns (the consumer holds the last batch while it asks for the next).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _tree
from .._recycle import Recycler
from ..pipeline.seeding import epoch_rng
from ._checks import Checks
from ._format import CacheInvalid
from ._reader import Reader, Stamps, map_shared
from ._schema import Field

__all__ = ["BufferPool", "Deferred", "KeptMapping", "finish", "permutation", "replay"]


def permutation(count: int, seed: int | Sequence[int] | None) -> np.ndarray:
    """The replay order for ``seed``: a ``(seed, epoch)`` pair or a seed alone (epoch 0), drawn
    by :func:`~asyncflow.pipeline.seeding.epoch_rng`; a fresh random one when ``seed`` is None."""
    if seed is None:
        return np.random.default_rng().permutation(count)
    key = (seed, 0) if isinstance(seed, int) else tuple(seed)
    return epoch_rng(*key).permutation(count)


def _leaf_maker(field: Field) -> Callable[[np.ndarray], Any]:
    if field.kind == "tensor":
        import torch

        if field.device == "cpu":
            return torch.from_numpy
        device = torch.device(field.device)
        return lambda a: torch.from_numpy(a).to(device)
    if field.kind == "ndarray":
        return lambda a: a
    if field.kind == "scalar":
        return lambda a: a[()]
    return lambda a: a.item()  # a Python bool, int or float


class BufferPool:
    """Batch buffers, reused once nobody but the pool holds them.

    A fresh 10 MB buffer per batch costs more in page faults than the copy into it; a buffer
    whose reference count shows that the consumer let go of every view of it is rewritten
    instead (``asyncflow/_recycle.py``'s ``"unreferenced"`` recycler). The count is exact: an
    array or tensor made from a buffer holds a reference to it, however it was sliced or
    wrapped. One pool may serve many epochs (a cached pipeline and its shuffled copies share
    one), in any threads.
    """

    def __init__(self, keep: int = 8) -> None:
        self._buffers: Recycler[tuple[tuple[int, ...], np.dtype[Any]], np.ndarray] = Recycler(
            lambda key, _: np.empty(*key), nbytes=lambda a: a.nbytes, limit=keep,
            returned="unreferenced",
        )

    def take(self, shape: tuple[int, ...], dtype: np.dtype[Any], rows: int) -> np.ndarray:
        """A buffer of ``shape`` and ``dtype`` that nobody holds, its first ``rows`` rows."""
        return self._buffers.acquire((shape, dtype))[:rows]


def _gather(source: Any, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Copy ``source[rows]`` into ``out``; ``source`` is an array or a torch view of one.

    torch's ``index_select`` copies rows at two to three times the rate of ``np.take`` (wide
    copies, on torch's intra-op threads, where ``take`` moves one row at a time): a shuffled
    replay spends most of its time here. ``np.take`` remains for what torch cannot view: a
    read-only array, or a dtype torch lacks.
    """
    if isinstance(source, np.ndarray):
        if not (source.flags.writeable and source.dtype in _TORCH_DTYPES):
            # mode="clip" skips the bounds check that makes take() buffer its output
            np.take(source, rows, axis=0, out=out, mode="clip")
            return out
        source = _torch_view(source)
    import torch

    index = torch.from_numpy(rows.astype(np.int64, copy=False))
    torch.index_select(source, 0, index, out=torch.from_numpy(out))
    return out


def _torch_view(array: np.ndarray) -> Any:
    import torch

    with warnings.catch_warnings():  # read-only is fine: the view is only read from
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(array)


_TORCH_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
))


class KeptMapping:
    """The cache as shuffled replays read it, mapped once and kept from epoch to epoch.

    Each epoch checks the cache and maps it afresh (:class:`Reader`), and a fresh mapping
    takes a page fault for every page it touches: a shuffled epoch, which copies every row
    out, ran at half its speed for that alone. This keeps one shared read-only mapping of the
    same files, with torch views of it; read-only, it is safe to keep, as nothing can write
    through it. A rebuilt cache is new files renamed into place: when the epoch's reader
    has other files than the kept ones (:attr:`Reader.stamps`), they are mapped anew.

    It holds one open descriptor per field while its pipeline lives; one is shared by a
    cached pipeline and its shuffled copies, in any threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps: Stamps | None = None
        self._sources: tuple[Any, ...] = ()
        self._arrays: tuple[np.ndarray, ...] = ()

    def mapped(self, reader: Reader) -> tuple[tuple[np.ndarray, ...], tuple[Any, ...]]:
        """The kept mapping of ``reader``'s files as numpy arrays, and the views to gather
        rows from (both ``reader.arrays`` when the files changed again while being mapped)."""
        with self._lock:
            if self._stamps != reader.stamps:
                try:
                    arrays = map_shared(reader)
                except (CacheInvalid, OSError):
                    return reader.arrays, reader.arrays
                self._arrays = arrays
                self._sources = tuple(
                    _torch_view(a) if a.dtype in _TORCH_DTYPES else a for a in arrays
                )
                self._stamps = reader.stamps
            return self._arrays, self._sources


class Deferred(functools.partial[Any]):
    """A batch still to be copied out of the cache: :func:`finish` copies it (calls it).

    Holds the mapping, the rows and the buffer pool, not the batch's memory: a run stopped
    with deferred batches in its queues drops them at no cost.
    """

    def __repr__(self) -> str:
        return "<asyncflow.cache deferred batch>"


def finish(item: Any) -> Any:
    """``item``, or the batch a :class:`Deferred` item stands for, copied now in this thread."""
    return item() if type(item) is Deferred else item


def replay(
    reader: Reader,
    order: np.ndarray | None = None,
    buffers: BufferPool | None = None,
    kept: KeptMapping | None = None,
    *,
    defer: bool = False,
    checks: Checks | None = None,
) -> Iterator[Any]:
    """Yield the cached items, in stored order or in ``order`` (a permutation of samples).

    The arrays and tensors yielded in stored order share memory with the mapping (pages a
    consumer writes to become its private copies); shuffled batches are gathered into
    buffers from ``buffers`` that no earlier batch still in use occupies. With ``defer``,
    batches that need a copy are yielded as :class:`Deferred` copies for :func:`finish`
    (the pages they read are still requested ahead from the kernel, when they are yielded).

    Before an item is yielded, the blocks its rows lie in are checked against their
    checksums, unless ``checks`` (a record kept across epochs) says they were already.
    Advancing the iterator blocks (checks, page faults, copies): do it off the event loop.

    Raises:
        SourceError: A block read does not match its checksum (see :class:`Checks`).
    """
    structure = reader.manifest["structure"]
    if structure is None or reader.count == 0:
        return iter(())
    checks = checks if checks is not None else Checks()
    makers = [_leaf_maker(f) for f in reader.fields]
    tree = _tree.Tree.from_json(structure)  # the inverse of _schema.flatten's structure

    def build(parts: list[np.ndarray]) -> Any:
        return tree.unflatten([make(p) for make, p in zip(makers, parts, strict=True)])

    if reader.layout == "batches":
        sources: Sequence[Any] = reader.arrays
        read = reader.arrays  # checked through the mapping the rows are read from
        if order is not None and kept is not None:
            read, sources = kept.mapped(reader)
        return _batches(reader, sources, read, order, build, buffers or BufferPool(), defer,
                        checks)
    return _samples(reader, order, build, checks)


def _samples(reader: Reader, order: np.ndarray | None,
             build: Callable[[list[np.ndarray]], Any], checks: Checks) -> Iterator[Any]:
    def sample(i: Any) -> Any:
        parts = [a[i, ...] for a in reader.arrays]  # [i, ...]: a field of shape () too
        return build([np.array(p) for p in parts] if reader.copy else parts)

    rows: Sequence[int] | np.ndarray = range(reader.count) if order is None else order
    batch = reader.batch_size or _CHECKED_ROWS
    for start in range(0, reader.count, batch):
        stop = min(start + batch, reader.count)
        checks.verify(reader, slice(start, stop) if order is None else order[start:stop])
        if reader.batch_size is None:
            yield from map(sample, rows[start:stop])
        else:  # lists of samples
            yield [sample(i) for i in rows[start:stop]]


# Single samples are checked this many at a time, before the first of them is yielded.
_CHECKED_ROWS = 256


def _batches(reader: Reader, sources: Sequence[Any], read: Sequence[np.ndarray],
             order: np.ndarray | None, build: Callable[[list[np.ndarray]], Any],
             buffers: BufferPool, defer: bool, checks: Checks) -> Iterator[Any]:
    count, batch = reader.count, reader.batch_size or reader.count
    shapes = [(batch, *a.shape[1:]) for a in reader.arrays]
    dtypes = [a.dtype for a in reader.arrays]
    for start in range(0, count, batch):
        stop = min(start + batch, count)
        ahead = range(stop, min(stop + batch, count)) if order is None else order[stop:stop + batch]
        if len(ahead):
            reader.prefetch(ahead)
        checks.verify(reader, slice(start, stop) if order is None else order[start:stop], read)
        if order is None and not reader.copy:
            yield build([a[start:stop] for a in reader.arrays])
            continue
        # shuffled, or a read-only mapping the consumer must not see
        rows: slice | np.ndarray = slice(start, stop) if order is None else order[start:stop]
        copy = Deferred(_copy_rows, reader.arrays if order is None else sources, rows, shapes,
                        dtypes, buffers, build)
        yield copy if defer else copy()


def _copy_rows(sources: Sequence[Any], rows: slice | np.ndarray,
               shapes: list[tuple[int, ...]], dtypes: list[np.dtype[Any]],
               buffers: BufferPool, build: Callable[[list[np.ndarray]], Any]) -> Any:
    """One batch of ``rows`` of each source, copied into buffers nobody else holds."""
    size = rows.stop - rows.start if isinstance(rows, slice) else len(rows)
    parts = [buffers.take(shape, dtype, size) for shape, dtype in zip(shapes, dtypes, strict=True)]
    for out, source in zip(parts, sources, strict=True):
        if isinstance(rows, slice):
            np.copyto(out, source[rows])
        else:
            _gather(source, rows, out)
    return build(parts)  # only the consumer's references keep a buffer from reuse
