"""The run scope: resources shared by a run's stages, closed when the run ends, even when the
close itself is cancelled (a stop landing while the run tears down)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from asyncflow._scope import RunScope, aclose_scopes


class _GatedClose:
    """A scope resource whose close waits for ``gate``, and logs that it ran to its end."""

    def __init__(self, gate: asyncio.Event, log: list[str], name: str) -> None:
        self.gate, self.log, self.name = gate, log, name

    async def __aenter__(self) -> _GatedClose:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.gate.wait()
        self.log.append(self.name)


async def test_a_cancelled_scope_close_still_closes_everything(async_leak_check: object) -> None:
    gate, log = asyncio.Event(), list[str]()

    def gated(name: str) -> Callable[[], _GatedClose]:
        return lambda: _GatedClose(gate, log, name)

    scopes = [RunScope(), RunScope()]
    for n, scope in enumerate(scopes):
        await scope.get("a", gated(f"{n}a"))
        await scope.get("b", gated(f"{n}b"))
    closing = asyncio.create_task(aclose_scopes(scopes))
    for _ in range(3):  # a stop cancels the closing task while a close waits, again and again
        await asyncio.sleep(0)
        closing.cancel()
    await asyncio.sleep(0)
    assert not closing.done()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == ["0b", "0a", "1b", "1a"]  # every resource, newest first, scope by scope
    await scopes[0].aclose()  # again: nothing more to do
    assert log == ["0b", "0a", "1b", "1a"]
    with pytest.raises(RuntimeError, match="stopped"):
        await scopes[1].get("c", gated("c"))


async def test_a_cancel_landing_as_the_close_ends_is_not_swallowed(
    async_leak_check: object,
) -> None:
    gate, log = asyncio.Event(), list[str]()
    scope = RunScope()
    await scope.get("a", lambda: _GatedClose(gate, log, "a"))
    closing = asyncio.create_task(scope.aclose())
    await asyncio.sleep(0)  # the close waits for the gate
    gate.set()  # the close ends at its next step...
    closing.cancel()  # ...the very step its caller takes the cancellation in
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == ["a"]


class _SlowOpen:
    """A resource whose opening waits for ``gate`` (an S3 client fetching credentials)."""

    def __init__(self, gate: asyncio.Event, log: list[str]) -> None:
        self.gate, self.log = gate, log

    async def __aenter__(self) -> _SlowOpen:
        await self.gate.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.log.append("closed")


async def test_a_resource_opened_while_the_scope_closes_is_closed_not_leaked(
    async_leak_check: object,
) -> None:
    # Was: its close was pushed on a stack already closed, so it never ran (an unclosed
    # client), and the caller got it as if the run went on.
    gate, log = asyncio.Event(), list[str]()
    scope = RunScope()
    getting = asyncio.create_task(scope.get("s3", lambda: _SlowOpen(gate, log)))
    await asyncio.sleep(0)
    await scope.aclose()
    gate.set()
    with pytest.raises(RuntimeError, match="stopped"):
        await getting
    assert log == ["closed"]
