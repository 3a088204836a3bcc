"""Watching a run from its own loop: queue fill, the loop's lag, stalls, periodic reports."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import StallError
from ._node import NodeContext
from ._stats import PipelineStats

__all__ = ["Monitor"]

logger = logging.getLogger("asyncflow")

_SAMPLE_EVERY = 0.05


class Monitor:
    """Samples a run every 50 ms, on the run's loop.

    Each sample adds every queue's fill to its average, notes how late the loop woke up,
    cancels a stage that has had work in hand and produced nothing for ``stall_timeout``
    seconds (recording a :class:`StallError` for it in :attr:`stalled`), and logs the
    stats table every ``report_every`` seconds.
    """

    def __init__(
        self,
        name: str,
        contexts: Sequence[NodeContext],
        outputs: Sequence[Any],
        *,
        stall_timeout: float | None,
        report_every: float | None,
    ) -> None:
        self.name = name
        self.contexts = contexts
        self.outputs = outputs
        self.stall_timeout = stall_timeout
        self.report_every = report_every
        self.stalled: dict[NodeContext, StallError] = {}
        #: The longest callback that held the run's loop (seconds).
        self.loop_delay_max = 0.0

    async def run(
        self, tasks: dict[Any, asyncio.Task[None]], report: Callable[[], PipelineStats]
    ) -> None:
        """Sample until cancelled; a stalled stage's task in ``tasks`` (by context) is
        cancelled, and
        ``report()`` is logged every ``report_every`` seconds."""
        last = time.monotonic()
        next_report = last + (self.report_every or float("inf"))
        while True:
            await asyncio.sleep(_SAMPLE_EVERY)
            now = time.monotonic()
            # How late this wake-up came: the longest callback that held the loop meanwhile.
            self.loop_delay_max = max(self.loop_delay_max, now - last - _SAMPLE_EVERY)
            if self.contexts:  # the hand-off's fullness: whether the consumer keeps up
                self.contexts[-1].counters.full_area += self.outputs[-1].fullness() * (now - last)
            for index, ctx in enumerate(self.contexts):
                ctx.counters.fill_area += len(self.outputs[index]) * (now - last)
                if self._stalls(index, ctx, now):
                    tasks[ctx].cancel()
            last = now
            if now >= next_report:
                next_report = now + (self.report_every or float("inf"))
                logger.info("asyncflow pipeline %r:\n%s", self.name, report())

    def _stalls(self, index: int, ctx: NodeContext, now: float) -> bool:
        stall = self.stall_timeout
        if stall is None or ctx in self.stalled:
            return False
        counters = ctx.counters
        silent = now - counters.last_progress
        output = self.outputs[index]
        if counters.in_flight and silent > stall and len(output) < output.capacity:
            self.stalled[ctx] = StallError(
                f"stage {ctx.name!r} has had work in hand and produced nothing for "
                f"{silent:.1f} s (stall_timeout={stall} s)"
            )
            return True
        return False

