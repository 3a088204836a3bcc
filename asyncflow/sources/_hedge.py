"""Hedged reads: a second request for an object that is slower than its host usually is.

A read still running when the host's recent latencies say it should be done (their
``Retry.hedge_quantile``, p90 by default, and at least twice their median) sends one more
request for the same object, and one more again if both are that late (at most
:data:`MAX_HEDGES`; none after a hedge failed). The first complete answer wins; the other
requests are cancelled and their connections closed. Each answer is checked as any other
(Content-Length, decoding, the transport's validators), so a hedge never changes the bytes
delivered. Hedges are budgeted: each request earns ``Retry.hedge`` of one (0.15 by default),
and a hedge spends one, so they never add more than that share of a host's requests, counted
over the run (a budget saved in the middle of a run pays for the stragglers at its end, when no
new request earns any). None are sent to a host that throttled in the last two seconds, nor
before it has answered ``_latency.MIN_SAMPLES`` requests (:mod:`._latency` keeps the
latencies); a request sent before then is hedged once it is late by the estimate taken later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from .._errors import SourceError
from ._limiter import HostLimiter
from ._retry import Transient

__all__ = ["MAX_HEDGES", "RECHECK", "race"]

T = TypeVar("T")

log = logging.getLogger("asyncflow.sources")

#: Seconds between looks at a request that has no estimate yet, or cannot be hedged now.
RECHECK = 0.1
#: Hedges of one try at most: a second goes when the first is late as well.
MAX_HEDGES = 2


class _Hedge(Generic[T]):
    """The hedges of one try (at most :data:`MAX_HEDGES`), and the primary's timeout scope
    the first to deliver cuts short."""

    __slots__ = ("_backup", "_gate", "_last", "_loop", "_quantile", "result", "scope",
                 "tasks", "timer", "won")

    def __init__(
        self, backup: Callable[[], Awaitable[T]], gate: HostLimiter, quantile: float
    ) -> None:
        self._backup, self._gate, self._quantile = backup, gate, quantile
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()  # when the latest request of this try was sent
        self.tasks: list[asyncio.Task[None]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.scope: asyncio.Timeout | None = None
        self.won = False
        self.result: Any = None

    def arm(self) -> None:
        """Send a hedge if the latest request of this try is late now, else look again when
        it will be. A second hedge goes only while the first is still running too: both
        requests drew the host's tail (a hedge that failed says the object is trouble, not
        late).

        The estimate is taken again each time: a request sent before the host had answered
        enough others (the first few hundred of a run) is still hedged once it is late.
        """
        if self.scope is None or any(task.done() for task in self.tasks):
            return  # the primary has ended, or a hedge has
        gate = self._gate
        late = gate.latencies.hedge_after(self._quantile)
        if late is None:
            wait = RECHECK
        else:
            now = self._loop.time()
            wait = self._last + late - now
            if wait <= 0:
                if self._tail(late) and gate.spend_hedge():
                    self.tasks.append(self._loop.create_task(self._run()))
                    self._last = now
                    if len(self.tasks) < MAX_HEDGES:
                        self.timer = self._loop.call_later(late, self.arm)
                    return
                wait = max(RECHECK, late)  # over budget, or congested: look again later
        self.timer = self._loop.call_later(wait, self.arm)

    def _tail(self, late: float) -> bool:
        """Whether this request is late on its own, as a latency tail is, rather than with
        many others at once: congestion (of the host, or of this process) delays them all,
        and a second request would only add to it. Of the requests sent in the ``late``
        seconds before the last one now due, the estimate says ``1 - quantile`` are still
        in flight; hedge while at most twice that share are (so that a burst sent together,
        before the estimate settled, does not pass for a tail, while the last stragglers of
        a run do)."""
        share = 2.0 * (1.0 - self._quantile)
        return not self._gate.overdue(self._loop.time() - late, late, share)

    async def _run(self) -> None:
        gate, loop = self._gate, self._loop
        start = loop.time()
        try:
            result = await self._backup()
        except Transient as exc:  # the primary goes on; it will meet any lasting failure itself
            if exc.throttled:
                gate.throttle()
            log.debug("hedge of %s failed: %s", gate.name, exc.reason)
            return
        except SourceError:
            return
        gate.latencies.add(loop.time() - start)  # in the quantiles only: no number in send order
        if self.won:  # another hedge delivered first
            return
        self.result, self.won = result, True
        gate.hedges_won += 1
        if self.scope is not None:  # cut the primary short: the hedge's answer is the read's
            self.scope.reschedule(loop.time())

    async def rescued(self) -> bool:
        """After the primary failed: whether a hedge still running delivers instead."""
        self.scope = None
        pending = {task for task in self.tasks if not task.done()}
        while pending and not self.won:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        return self.won

    async def close(self) -> None:
        self.scope = None
        if self.timer is not None:
            self.timer.cancel()
        running = [task for task in self.tasks if not task.done()]
        for task in running:
            task.cancel()
        if running:  # their connections are closed before the read returns
            await asyncio.wait(running)


async def race(
    attempt: Callable[[], Awaitable[T]],
    backup: Callable[[], Awaitable[T]],
    gate: HostLimiter,
    quantile: float,
) -> T:
    """``attempt()``, raced by ``backup()`` if it runs late (see the module).

    ``backup`` must be a whole request of its own, sharing no state with ``attempt``.

    Raises:
        Transient, SourceError: The primary's failure, when no hedge delivered.

    Cancellation:
        Cancelling the caller cancels both requests and waits until the hedge has ended.
    """
    hedge: _Hedge[T] = _Hedge(backup, gate, quantile)
    try:
        # A timeout scope that only the hedge sets off: asyncio cancels the primary and
        # turns that into a TimeoutError here, leaving any other cancellation untouched.
        async with asyncio.timeout(None) as scope:
            hedge.scope = scope
            hedge.arm()
            try:
                return await attempt()
            except (Transient, SourceError):
                if not await hedge.rescued():
                    raise
    except TimeoutError:
        if not (hedge.won and scope.expired()):
            raise
    finally:
        await hedge.close()
    return hedge.result  # type: ignore[no-any-return]
