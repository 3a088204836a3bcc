"""Upstream's items as one async stream, whatever kind of iterable upstream's source is.

Both ways a cached pipeline reads upstream go through :func:`stream`: the gate of a filling
run's source (``_fill.py``) and an epoch given its upstream as a callable (``_epoch.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Sequence
from typing import Any

from ..pipeline import run_thread

__all__ = ["Upstream", "stream", "take"]

#: Returns a fresh iterable (or async iterable) of upstream's items for one pass.
Upstream = Callable[[], Iterable[Any] | AsyncIterable[Any]]

_CHUNK = 256  # items of a sync upstream iterator taken per thread hand-off


async def stream(source: Iterable[Any] | AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
    """The items of ``source``, closed (``aclose`` / ``close``) when the stream ends or is
    closed.

    An async iterable is iterated on the loop, a sequence too (its items exist already); any
    other iterator may list files or read a manifest, so it is advanced on the run's threads
    (:func:`~asyncflow.pipeline.run_thread`), ``_CHUNK`` items a hand-off.

    Cancellation:
        A chunk being taken on a thread finishes there before the iterator is closed (a
        generator cannot be closed while a thread runs it).
    """
    if isinstance(source, AsyncIterable):
        it = source.__aiter__()
        try:
            async for item in it:
                yield item
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()
    elif isinstance(source, Sequence):
        for item in source:
            yield item
    else:
        its = iter(source)
        taking: asyncio.Future[list[Any]] | None = None
        try:
            while True:
                taking = asyncio.ensure_future(run_thread(take, its, _CHUNK))
                chunk = await asyncio.shield(taking)
                if not chunk:
                    break
                for item in chunk:
                    yield item
        finally:
            if taking is not None and not taking.done():
                await asyncio.wait([taking])
            close = getattr(its, "close", None)
            if close is not None:
                await run_thread(close)


def take(items: Iterable[Any], size: int) -> list[Any]:
    """Up to ``size`` more of ``items`` ([] at their end)."""
    return list(itertools.islice(items, size))
