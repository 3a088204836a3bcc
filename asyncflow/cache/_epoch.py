"""One epoch of a cached pipeline: replay the cache, or fill it from upstream, or read upstream.

Each :meth:`CacheSource.run_epoch` returns the async iterator of one epoch and decides
afresh:

1. a valid cache with the upstream's fingerprint exists: replay it (shuffled when asked);
2. otherwise, when this process takes the writer lock: pass upstream's items through while
   writing them, and commit when upstream ends (an epoch stopped early writes nothing);
3. otherwise another process is writing it: read upstream this epoch (``wait=False``), or
   wait for that writer and replay what it wrote (``wait=True``).

Why a cache is not used (missing, unfinished, truncated, damaged, another fingerprint) goes to
the ``asyncflow.cache`` logger. A block found damaged while replaying ends that epoch with a
``SourceError``; the next epoch rebuilds the cache.

An epoch runs on the run's event loop, so everything that touches the file system (the checks
and the mapping, the writer lock, each write, the commit with its ``fsync`` and rename,
replaying with its checksum checks and page faults) runs on the run's worker threads
(:func:`~asyncflow.pipeline.run_thread`): the loop stays free for the other stages. Work handed
to a thread finishes there even when the epoch is cancelled meanwhile; the run waits for its
threads before it ends.

In a cached pipeline's run, "upstream's items" are those reaching its ``cache`` stage from
upstream's source and stages, run as stages of the same run (see _fill.py); an epoch built to
replay has no upstream, and fails with a ``SourceError`` should the cache turn out unusable
(the next epoch rebuilds it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import SourceError
from ..pipeline import current_epoch, listing_identity, run_failed, run_thread
from ._checks import ALL_CHECKED, Checks
from ._fingerprint import describe_change
from ._format import MANIFEST, CacheInvalid, leftovers, read_manifest, remove_cache, remove_path
from ._lock import WriterLock, take_lock
from ._reader import Reader, Stamps, files_match, stamps_of
from ._replay import BufferPool, KeptMapping, permutation, replay
from ._writer import Writer

__all__ = ["CacheSource", "Upstream"]

log = logging.getLogger("asyncflow.cache")

#: Opens upstream's items for one pass (a filling run's ``cache`` stage hands them on).
Upstream = Callable[[], AsyncGenerator[Any, None]]


@dataclass(frozen=True)
class CacheSource:
    """The source of a cached pipeline; each :meth:`run_epoch` is one epoch.

    Args:
        path: The cache directory.
        layout: What upstream's items are: ``samples``, ``batches`` (collated: fields with a
            batch dimension) or ``lists`` (of samples); batches are stored per sample and
            batched again on replay.
        fingerprint: Identifies the upstream pipeline; a cache with another is rebuilt.
        summary: A small description of upstream, kept in the manifest to say what changed.
        key: The user's extra fingerprint input, kept in the manifest likewise.
        shuffle: Replay in a random order by sample index.
        seed: The seed of that order (None: a fresh order each epoch).
        wait: While another process writes the cache, wait for it instead of reading
            upstream.
        durable: fsync the cache when committing it.
    """

    path: Path
    layout: str
    fingerprint: str
    summary: Any = None
    key: Any = None
    shuffle: bool = False
    seed: int | None = None
    wait: bool = False
    durable: bool = False
    buffers: BufferPool = field(default_factory=BufferPool, compare=False, repr=False)
    kept: KeptMapping = field(default_factory=KeptMapping, compare=False, repr=False)
    checks: Checks = field(default_factory=Checks, compare=False, repr=False)

    def shuffled(self, seed: int | None) -> CacheSource:
        """This source replaying in a random order by index: with a ``seed``, the order
        depends on the seed and on the run's epoch (``current_epoch()``, which a resumed
        state's epoch sets: a resumed shuffled replay has that epoch's order)."""
        return dataclasses.replace(self, shuffle=True, seed=seed)

    def __call__(self) -> AsyncGenerator[Any, None]:
        """An epoch that replays (a filling run's ``cache`` stage gives its epoch upstream's
        items: :meth:`run_epoch`)."""
        return self.run_epoch(None)

    def listing_identity(self) -> dict[str, Any]:
        """What a resume state must find again (``asyncflow/_identity.py``): the
        data the cache holds, named by its upstream's fingerprint (the source's listing with
        each file's size and time, each stage's settings, the key), wherever it lies."""
        return listing_identity([f"upstream {self.fingerprint[:16]}"])

    def run_epoch(self, upstream: Upstream | None, *, defer: bool = False
                  ) -> AsyncGenerator[Any, None]:
        """One epoch reading ``upstream`` when it does not replay.

        Args:
            upstream: Returns upstream's items for this pass; ``None``: the epoch can only
                replay, and raises ``SourceError`` when the cache turns out unusable.
            defer: Batches that need a copy come as :class:`~asyncflow.cache._replay.Deferred`
                copies, which the consumer makes (:func:`~asyncflow.cache._replay.finish`).
        """
        epoch = current_epoch()  # the run's (outside a run, called directly: 0)
        return self._epoch(0 if epoch is None else epoch, upstream, defer=defer)

    def ready(self) -> bool:
        """Whether the manifest says the cache can be replayed now (its files are checked by
        the epoch); False when an epoch would fill it or wait for it (that epoch logs why).
        Reads only the manifest and ``stat``s the files: it runs in the consumer's thread."""
        try:
            manifest = read_manifest(self.path)
            if self._mismatch(manifest) is not None:
                return False
            stamps = stamps_of(self.path, manifest)
            return (self.checks.damage(stamps) is None
                    and files_match(self.path, manifest, stamps))
        except (FileNotFoundError, CacheInvalid):
            return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    async def _epoch(self, epoch: int, upstream: Upstream | None, *, defer: bool = False
                     ) -> AsyncGenerator[Any, None]:
        # An async generator: the engine closes it (aclose) however the run ends, which
        # releases the lock and removes an unfinished write at once.
        reader = await run_thread(self._open, True)
        if reader is None:
            if upstream is None:
                await run_thread(self._discard, None)
                raise SourceError(f"cache {self.path} was found unusable when its epoch began "
                                  "(see the asyncflow.cache log); the next epoch rebuilds it")
            lock = WriterLock(self.path)
            if not await take_lock(lock):
                holder = await run_thread(lock.holder)
                if not self.wait:
                    log.info("cache %s is being written by process %s; this epoch reads "
                             "upstream", self.path, holder)
                    async with contextlib.aclosing(upstream()) as items:
                        async for item in items:
                            yield item
                    return
                log.info("cache %s is being written by process %s; waiting for it",
                         self.path, holder)
                await take_lock(lock, wait=True)
            try:
                # another writer may have just finished
                reader = await run_thread(self._open, False)
                if reader is None:
                    async with contextlib.aclosing(self._fill(upstream)) as items:
                        async for item in items:
                            yield item
                    return
            finally:
                await run_thread(lock.release)
        async with contextlib.aclosing(self._replay(reader, epoch, defer=defer)) as items:
            async for item in items:
                yield item

    async def _replay(self, reader: Reader, epoch: int, *, defer: bool
                      ) -> AsyncGenerator[Any, None]:
        seed = None if self.seed is None else [self.seed % 2**64, epoch]
        order = permutation(reader.count, seed) if self.shuffle else None
        # Deferred copies of blocks all checked already: advancing costs microseconds (row
        # indices, a residency probe), less than a thread hand-off; the consumer copies.
        inline = defer and reader.layout == "batches" and self.checks.complete(reader)
        # replay() maps the files a shuffled replay reads through: on a thread too
        items = await run_thread(replay, reader, order, self.buffers, self.kept,
                                 defer=defer, checks=ALL_CHECKED if inline else self.checks)
        # Items that hold no memory of their own (single samples, views of the mapping,
        # deferred copies) are taken from the thread several at a time, so that the hand-offs
        # cost little per item; copied batches one at a time, so that few buffers are in use.
        copies = reader.layout == "batches" and not defer and (order is not None or reader.copy)
        if inline:
            for item in items:
                yield item
            return
        size = 1 if copies else _REPLAY_CHUNK[reader.layout]
        chunk: list[Any]
        try:
            while chunk := await run_thread(list, itertools.islice(items, size)):
                for item in chunk:
                    yield item
        except SourceError:
            if self.checks.damage(reader.stamps) is not None:
                await run_thread(self._discard, reader.stamps)
            raise

    def _mismatch(self, manifest: dict[str, Any]) -> str | None:
        """Why a cache with ``manifest`` is not this source's, else None."""
        if manifest.get("fingerprint") != self.fingerprint:
            old = manifest.get("fingerprint")
            if manifest.get("key") != self.key:
                change = f"key {manifest.get('key')!r} -> {self.key!r}"
            elif manifest.get("upstream") != self.summary:
                change = describe_change(manifest.get("upstream"), self.summary)
            else:
                change = f"fingerprint {str(old)[:12]} -> {self.fingerprint[:12]}"
            return f"the upstream pipeline changed since it was written: {change}"
        if manifest.get("layout") != self.layout:
            return f"it holds {manifest.get('layout')}, upstream yields {self.layout}"
        return None

    def _open(self, say_why: bool) -> Reader | None:
        try:
            reader = Reader.open(self.path)
            why = self._mismatch(reader.manifest) or self.checks.damage(reader.stamps)
            if why is not None:
                raise CacheInvalid(why)
        except FileNotFoundError:
            if say_why:
                left = leftovers(self.path)
                if left and WriterLock(self.path).holder() is None:
                    log.warning("cache %s: found %s, left by a writer that did not finish; "
                                "rebuilding", self.path, left[0].name)
                else:
                    log.info("cache %s does not exist yet", self.path)
            return None
        except CacheInvalid as exc:
            if say_why:
                # its text only: a log record keeping the exception would keep its traceback,
                # and with it the mapped files of the cache that failed its checks
                log.warning("cache %s cannot be used: %s; rebuilding it", self.path, str(exc))
            return None
        return reader

    def _discard(self, stamps: Stamps | None) -> None:
        """Take a damaged cache out of use: its files are noted as damaged (``checks``), so
        :meth:`ready` says no to them, and on disk its manifest (the mark of a finished cache)
        is removed, so that the next epoch rebuilds it in any process, not only in this one.
        On disk only under the writer lock, and only while the files are still those found
        damaged (``stamps``; ``None``: those at ``path`` now, found unusable as a replay
        began): a writer's new cache is never removed."""
        with contextlib.suppress(FileNotFoundError, CacheInvalid):
            if stamps is None:
                stamps = stamps_of(self.path, read_manifest(self.path))
                self.checks.refuse(stamps, "found unusable as its replay began")
            lock = WriterLock(self.path)
            if not lock.acquire():
                return  # a writer is at work: it replaces the cache anyway
            try:
                if stamps_of(self.path, read_manifest(self.path)) == stamps:
                    (self.path / MANIFEST).unlink()
                    log.warning("cache %s cannot be used: %s; its manifest is removed, "
                                "rebuilding it in the next epoch (of any process)", self.path,
                                self.checks.damage(stamps))
            finally:
                lock.release()

    async def _fill(self, upstream: Upstream) -> AsyncGenerator[Any, None]:
        """Pass upstream's items through, writing each; commit when upstream ends.

        Runs with the writer lock held, so whatever else lies at or beside ``path`` is from
        a writer that stopped midway or a cache that failed its checks: it is removed first.
        Each item is written (on a worker thread) before it is yielded, so a consumer that
        changes its items in place cannot change the cache. Nothing is committed when a
        stage of the run failed (:func:`~asyncflow.pipeline.run_failed`): upstream's stream
        then ends early, as if complete.
        """
        await run_thread(self._clear)
        meta = {"fingerprint": self.fingerprint, "key": self.key, "upstream": self.summary}
        writer = await run_thread(Writer, self.path, layout=self.layout, meta=meta)
        try:
            async with contextlib.aclosing(upstream()) as items:
                async for item in items:
                    await run_thread(writer.write, item)
                    yield item
            if run_failed():  # upstream's stream ended because a stage of it failed
                log.info("cache %s not written: the run failed before its end", self.path)
                return
            await run_thread(writer.commit, durable=self.durable)
            log.info("cache %s written: %d samples in %d items", self.path, writer.count,
                     writer.items)
        finally:
            # after a commit the temporary directory is gone: a no-op
            await run_thread(writer.abort)

    def _clear(self) -> None:
        for stale in leftovers(self.path):
            remove_path(stale)
        remove_cache(self.path)


_REPLAY_CHUNK = {"samples": 256, "lists": 16, "batches": 8}  # items a thread hand-off
