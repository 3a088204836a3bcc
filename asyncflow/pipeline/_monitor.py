"""Watching a run from its own loop: queue fill, the loop's lag, stalls, periodic reports."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import StallError
from ._node import NodeContext
from ._options import RunOptions
from ._stats import PipelineStats

__all__ = ["Monitor"]

logger = logging.getLogger("asyncflow")

_SAMPLE_EVERY = 0.05


class Monitor:
    """Samples a run every 50 ms, on the run's loop.

    It watches a run's graph (``_graph.Graph``'s ``contexts``, ``outputs`` and running
    ``tasks`` by context, read as they grow). Each sample adds every queue to its average
    fill, notes how late the loop woke up, cancels a stage that has had work in hand and
    produced nothing for the options' ``stall_timeout`` seconds (recording a
    :class:`StallError` for it in :attr:`stalled`), and logs the stats table every
    ``report_every`` seconds.
    """

    def __init__(
        self, contexts: Sequence[NodeContext], outputs: Sequence[Any],
        tasks: dict[Any, asyncio.Task[None]], options: RunOptions,
    ) -> None:
        self.contexts, self.outputs, self.tasks = contexts, outputs, tasks
        self.options = options
        self.stalled: dict[NodeContext, StallError] = {}
        #: The longest callback that held the run's loop (seconds).
        self.loop_delay_max = 0.0

    async def run(self, report: Callable[[], PipelineStats]) -> None:
        """Sample until cancelled; a stalled stage's task is cancelled, and ``report()`` is
        logged every ``report_every`` seconds."""
        last = time.monotonic()
        next_report = last + (self.options.report_every or float("inf"))
        while True:
            await asyncio.sleep(_SAMPLE_EVERY)
            now = time.monotonic()
            # How late this wake-up came: the longest callback that held the loop meanwhile.
            self.loop_delay_max = max(self.loop_delay_max, now - last - _SAMPLE_EVERY)
            # the hand-off's fullness: whether the consumer keeps up
            self.contexts[-1].counters.full_area += self.outputs[-1].fullness() * (now - last)
            for index, ctx in enumerate(self.contexts):
                ctx.counters.fill_area += len(self.outputs[index]) * (now - last)
                self._cancel_if_stalled(index, ctx, now)
            last = now
            if now >= next_report:
                next_report = now + (self.options.report_every or float("inf"))
                logger.info("asyncflow pipeline %r:\n%s", self.options.name, report())

    def _cancel_if_stalled(self, index: int, ctx: NodeContext, now: float) -> None:
        stall = self.options.stall_timeout
        if stall is None or ctx in self.stalled:
            return
        counters = ctx.counters
        silent = now - counters.last_progress
        output = self.outputs[index]
        if counters.in_flight and silent > stall and len(output) < output.capacity:
            self.stalled[ctx] = StallError(
                f"stage {ctx.name!r} has had work in hand and produced nothing for "
                f"{silent:.1f} s (stall_timeout={stall} s)"
            )
            self.tasks[ctx].cancel()
