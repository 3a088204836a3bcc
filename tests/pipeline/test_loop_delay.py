"""``stats().loop_delay_max``: blocking work on a run's loop shows up in its stats."""

from __future__ import annotations

import time

from asyncflow import Pipeline


async def _blocks_the_loop(x: int) -> int:
    if x == 3:
        time.sleep(0.3)  # a blocking call inside an async function: the mistake to expose
    return x


def test_a_blocking_callback_on_the_loop_is_reported() -> None:
    def slow(x: int) -> int:
        time.sleep(0.02)
        return x

    pipe = Pipeline(range(20)).map(slow).map(_blocks_the_loop)
    assert list(pipe) == list(range(20))
    assert pipe.stats().loop_delay_max >= 0.2


def test_the_figure_starts_at_zero() -> None:
    pipe = Pipeline(range(3))
    assert pipe.stats().loop_delay_max == 0.0
    list(pipe)
    assert pipe.stats().loop_delay_max >= 0.0
