"""Pickling across processes with large buffers in shared memory, not in the pipe.

Pickle protocol 5 hands every large contiguous buffer (a NumPy array's data, a tensor's storage
through a registered reducer) to a callback instead of copying it into the byte stream. Here
each such buffer is written once into a file of its own in ``/dev/shm`` (a segment); only its
name and size travel through the pipe. The receiver maps the segment, unlinks its name at once
and rebuilds the array on the mapping, with no further copy: the memory is freed when the last
array that uses it is.

Segment names carry the creating pool's process id and token
(``asyncflow-<pid>-<token>-...``), so a pool can sweep whatever its workers wrote and nobody
received (a worker killed mid-write, a run stopped with results in the pipe), and a later pool
can sweep what a crashed process left behind.

The engine knows no tensor type: a feature registers a reducer for its types
(``_reducers.register_reducer``; ``asyncflow.torch`` does, for CPU tensors), and the reducer's
module is imported in every worker, so that both sides agree.

A worker may also make a result in a segment from the start (:func:`allocate`: a collate
stacking a batch straight into shared memory); such a buffer is sent by name, not copied.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import mmap
import os
import pickle
import re
import tempfile
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ._reducers import Pickler, cloud_pickler, load_lazy

__all__ = [
    "SHM_DIR",
    "SHM_THRESHOLD",
    "allocate",
    "allocate_as",
    "discard",
    "dumps",
    "loads",
    "map_private",
    "pickle_by_value",
    "segment_prefix",
    "sweep",
    "sweep_stale",
    "write_segments",
]

#: Where segments live: tmpfs on Linux; the temporary directory elsewhere.
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

#: Buffers of at least this many bytes go through shared memory; smaller ones in the pipe.
SHM_THRESHOLD = 64 * 1024

_NAME = re.compile(r"^asyncflow-(\d+)-")

# In a worker process: how allocate names a segment, and the segments it made that are not
# sent yet, by address: (path, size, what unlinks the name if the buffer is freed unsent).
_allocate_name: Callable[[], str] | None = None
_made: dict[int, tuple[str, int, weakref.finalize[Any, Any]]] = {}


def segment_prefix(token: str) -> str:
    """The name prefix of the segments of the pool ``token`` of this process."""
    return f"asyncflow-{os.getpid()}-{token}-"


def dumps(
    obj: Any, name: Callable[[], str] | None = None, *, by_value: bool = False
) -> tuple[bytes, list[tuple[str, int]]]:
    """Pickle ``obj``; buffers of ``SHM_THRESHOLD`` bytes or more go to new segments.

    Args:
        obj: What to send.
        name: Returns a fresh segment file name for each large buffer (``None``: every
            buffer stays in the byte stream, as it does when ``SHM_DIR`` has no room).
        by_value: Pickle classes and functions of ``__main__`` by value at once (cloudpickle),
            for a receiver that could not load them by reference.

    Returns:
        ``(payload, segments)``: the pickle, and ``(path, size)`` of each segment, in order.

    Raises:
        pickle.PicklingError, TypeError, AttributeError: ``obj`` cannot be pickled, even by
            value (cloudpickle is tried when plain pickle fails).
    """
    load_lazy()
    try:
        payload, big = _pickle(obj, by_value=by_value, apart=name is not None)
    except (pickle.PicklingError, TypeError, AttributeError):
        if by_value:
            raise
        # Classes and functions of __main__ (a notebook cell) travel by value.
        payload, big = _pickle(obj, by_value=True, apart=name is not None)
    if name is None:
        return payload, []
    try:
        return payload, write_segments(big, name)
    except OSError:  # no room in SHM_DIR (a container's 64 MB /dev/shm): all in the pipe
        return dumps(obj, by_value=by_value)


def pickle_by_value(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj`` by value (cloudpickle, with the registered reducers), its buffers of
    ``SHM_THRESHOLD`` bytes or more left out of the stream: references, not copies.

    What a pool sends every worker at boot (its Dataset, say): :func:`write_segments` puts the
    buffers in shared memory once, and each worker maps them with :func:`map_private`.

    Raises:
        pickle.PicklingError, TypeError, AttributeError: ``obj`` cannot be pickled.
    """
    load_lazy()
    return _pickle(obj, by_value=True, apart=True)


def _pickle(obj: Any, *, by_value: bool, apart: bool) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``obj`` pickled (by value: with cloudpickle) and, if ``apart``, its buffers of
    ``SHM_THRESHOLD`` bytes or more, left out of the stream (references, not copies)."""
    big: list[pickle.PickleBuffer] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:
        if not apart or buffer.raw().nbytes < SHM_THRESHOLD:
            return True  # in band
        big.append(buffer)
        return False

    stream = io.BytesIO()
    pickler = cloud_pickler() if by_value else Pickler
    pickler(stream, protocol=5, buffer_callback=keep).dump(obj)
    return stream.getvalue(), big


def write_segments(buffers: Iterable[pickle.PickleBuffer],
                   name: Callable[[], str]) -> list[tuple[str, int]]:
    """Write each buffer to a new segment named ``name()``; return ``(path, size)`` of each.
    A buffer that is exactly a segment :func:`allocate` made is not written: that segment
    is handed over as it is.

    Raises:
        OSError: A segment could not be written (those written are unlinked).
    """
    segments: list[tuple[str, int]] = []
    try:
        for buffer in buffers:
            made = _hand_over(buffer.raw()) if _made else None
            if made is not None:
                segments.append(made)
                continue
            path = os.path.join(SHM_DIR, name())
            segments.append((path, _write_segment(path, buffer.raw())))
    except BaseException:
        discard(segments)
        raise
    return segments


def allocate_as(name: Callable[[], str] | None) -> None:
    """Let :func:`allocate` make segments named ``name()`` (a worker process, at start; the
    same names as its results' segments, so that its pool sweeps both)."""
    global _allocate_name
    _allocate_name = name


def allocate(nbytes: int) -> mmap.mmap | None:
    """A zeroed, writable buffer of ``nbytes`` in a new segment, for a result this worker
    process will send back: a buffer that spans it exactly (a tensor built on it) then goes
    to the parent by name, with no copy (:func:`write_segments`).

    Returns:
        The segment, mapped; ``None`` outside a worker process, below ``SHM_THRESHOLD``, or
        where ``SHM_DIR`` has no room for it: allocate as usual then. The segment's name is
        unlinked when the buffer is freed unsent.
    """
    if _allocate_name is None or nbytes < SHM_THRESHOLD:
        return None
    path = os.path.join(SHM_DIR, _allocate_name())
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            # pages reserved now: a full tmpfs refuses here, not with a SIGBUS mid-write
            os.posix_fallocate(fd, 0, nbytes)
        else:
            os.ftruncate(fd, nbytes)
        buffer = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)
    address = _address(buffer)
    _made[address] = (path, nbytes,
                       weakref.finalize(buffer, _unsent, address, path, os.getpid()))
    return buffer


def _address(buffer: Any) -> int:
    """Where a writable buffer's memory starts."""
    view = ctypes.c_char.from_buffer(buffer)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # an exported buffer could not be closed


def _hand_over(raw: memoryview) -> tuple[str, int] | None:
    """``(path, size)`` of the segment :func:`allocate` made that ``raw`` spans exactly, no
    longer this process's to unlink; ``None`` for any other buffer."""
    if raw.readonly or raw.nbytes == 0:
        return None
    address = _address(raw)
    made = _made.get(address)
    if made is None or made[1] != raw.nbytes:
        return None
    path, size, unsent = made
    del _made[address]
    unsent.detach()
    return path, size


def _unsent(address: int, path: str, pid: int) -> None:
    """An allocated buffer freed before it was sent: its segment goes too (not in a child
    this worker forked, whose copy of the buffer is freed as it exits)."""
    if os.getpid() != pid:
        return
    made = _made.get(address)
    if made is not None and made[0] == path:
        del _made[address]
    with contextlib.suppress(OSError):
        os.unlink(path)


def map_private(segments: Iterable[tuple[str, int] | bytearray]) -> list[Any]:
    """Map segments that several processes read (left in place): copy-on-write mappings, so
    every reader shares the same pages until it writes to its own copy of one. A buffer given
    as a ``bytearray`` (sent in band) is used as it is.

    Raises:
        OSError: A segment is missing or has the wrong size.
    """
    return [segment if isinstance(segment, bytearray)  # sent in the payload: no room in SHM_DIR
            else _map(*segment, received=False) for segment in segments]


def _write_segment(path: str, data: memoryview) -> int:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        view = data.cast("B")
        done = 0
        while done < len(view):  # a write to tmpfs is whole, but a short one must not be lost
            done += os.write(fd, view[done:])
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return len(view)


def _map(path: str, size: int, *, received: bool) -> Any:
    """The segment ``path`` of ``size`` bytes, mapped: ``received`` (one reader), its name
    unlinked at once and its pages shared; else copy-on-write, its name left for the others.

    Raises:
        OSError: The segment is missing or has the wrong size.
    """
    fd = os.open(path, os.O_RDWR if received else os.O_RDONLY)
    try:
        if received:
            os.unlink(path)
        held = os.fstat(fd).st_size
        if held != size:
            raise OSError(f"shared-memory segment {path} holds {held} bytes, expected {size}")
        if size == 0:
            return bytearray()
        if received:
            # Not populated: as torch's DataLoader maps a received batch, its pages enter this
            # process's memory as they are read. Populated at once, every batch received ahead
            # (those waiting for an earlier one, those in the hand-off) counted in this
            # process's PSS, where torch's, mapped unread or still descriptors, count nowhere:
            # the same bytes, 1.10x torch's PSS against 0.89x (docs/performance.md).
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def loads(payload: bytes, segments: list[tuple[str, int]]) -> Any:
    """Unpickle what :func:`dumps` made, mapping (and unlinking) its segments.

    Raises:
        OSError: A segment is missing or has the wrong size (its names are unlinked anyway).
    """
    buffers: list[Any] = []
    try:
        for path, size in segments:
            buffers.append(_map(path, size, received=True))
    except BaseException:
        discard(segments)
        raise
    return pickle.loads(payload, buffers=buffers)


def discard(segments: Iterable[tuple[str, int]]) -> None:
    """Unlink segments that will not be loaded."""
    for path, _ in segments:
        with contextlib.suppress(OSError):
            os.unlink(path)


def sweep(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; return how many there were."""
    return _sweep(lambda name: name.startswith(prefix))


def sweep_stale() -> int:
    """Unlink segments left by asyncflow processes that no longer exist."""
    return _sweep(_orphaned)


def _sweep(matches: Callable[[str], bool]) -> int:
    """Unlink every segment whose name ``matches``; return how many there were."""
    count = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHM_DIR):
            if matches(entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    count += 1
    return count


def _orphaned(name: str) -> bool:
    """Whether ``name`` is a segment of an asyncflow process that no longer exists."""
    match = _NAME.match(name)
    return match is not None and not _alive(int(match.group(1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
