"""Failures: the policy (fail fast by default; with a budget, skip, count and report, an item
named by ``asyncflow._redact.describe_item``), and what a run's consumer gets after the items:
the stages' errors made into one."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from .._errors import FailureBudgetExceeded, FailureRecord, PipelineError
from .._redact import describe_exception, format_exception

__all__ = [
    "FailureBudget", "final_error", "flatten", "mark_abandoned", "note_stage",
    "release_frames",
]

logger = logging.getLogger("asyncflow")

class FailureBudget:
    """How many items a stage may fail on before the pipeline fails.

    Args:
        limit: An int (that many failures allowed) or a float fraction of the items the stage
            has seen. A fraction is checked with a grace of one failure while few items have
            been seen, and exactly at the end of the stream.
        stage: The stage's name, for logs and errors.
    """

    _LOGGED_IN_FULL = 5
    _SUMMARY_EVERY = 5.0

    def __init__(self, limit: int | float, stage: str) -> None:
        self.limit = limit
        self.stage = stage
        self._logged = 0
        self._unlogged = 0
        self._last_summary = time.monotonic()

    def allows(self, failures: int, seen: int) -> bool:
        """Whether ``failures`` out of ``seen`` items are still within the budget."""
        if isinstance(self.limit, float):
            if self.limit <= 0.0:
                return failures == 0
            return failures <= max(1.0, self.limit * seen)
        return failures <= self.limit

    def check_end(self, failures: int, seen: int, records: Sequence[FailureRecord]) -> None:
        """At the end of the stream: raise if the budget is exceeded or every item failed.

        Args:
            failures: The items that failed.
            seen: The items the stage took.
            records: The stage's failure records (each item and message redacted as the
                record was made), which the error carries.

        Raises:
            FailureBudgetExceeded: Carrying ``records``.
        """
        if seen and failures == seen:
            message = (f"stage {self.stage!r}: every one of its {seen} items failed; "
                       "an epoch that yields nothing is treated as an error")
        elif isinstance(self.limit, float) and failures > self.limit * seen:
            message = (f"stage {self.stage!r}: {failures} of {seen} items failed "
                       f"({failures / seen:.1%}), over the budget of {self.limit:.1%}")
        else:
            return
        raise FailureBudgetExceeded(message, stage=self.stage, failures=records)

    def log_skip(self, item: str, exc: BaseException) -> None:
        """Log a skipped item: the first few in full, then a periodic count."""
        if self._logged < self._LOGGED_IN_FULL:
            self._logged += 1
            logger.warning(
                "stage %r: skipped item %s: %s", self.stage, item, describe_exception(exc)
            )
            return
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_summary >= self._SUMMARY_EVERY:
            logger.warning(
                "stage %r: skipped %d more failed items (see pipe.stats().failures)",
                self.stage, self._unlogged,
            )
            self._unlogged = 0
            self._last_summary = now


#: The packages whose frames :func:`release_frames` clears: asyncflow's own and asyncio's.
_OURS = tuple(
    os.path.dirname(path) + os.sep
    for path in (os.path.dirname(os.path.abspath(__file__)), os.path.abspath(asyncio.__file__))
)


def flatten(exc: BaseException) -> list[BaseException]:
    """The leaves of ``exc``'s exception groups (``[exc]`` when it is not one)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in flatten(sub)]
    return [exc]


def note_stage(exc: BaseException, ctx: Any) -> None:
    """Note on ``exc`` the stage (a ``NodeContext``) it failed in, once: the note, and the
    stage's name for :func:`final_error`."""
    notes = getattr(exc, "__notes__", ())
    if not any(str(n).startswith("asyncflow: stage") for n in notes):
        exc.add_note(
            f"asyncflow: stage {ctx.name!r} ({ctx.counters.kind} #{ctx.index}) failed "
            f"after producing {ctx.counters.items_out} item(s)"
        )
    if getattr(exc, "_asyncflow_stage", None) is None:
        exc._asyncflow_stage = ctx.name  # type: ignore[attr-defined]


def final_error(name: str, errors: list[BaseException]) -> BaseException | None:
    """What the consumer of run ``name`` gets after the items: ``None`` (no ``errors``); a
    ``BaseException`` raised in a stage (``KeyboardInterrupt``, ``SystemExit``) as itself,
    noting the others; else a :class:`PipelineError` naming the failed stages. Never raises:
    should building the error fail, the first one."""
    if not errors:
        return None
    try:
        fatal = next((e for e in errors if not isinstance(e, Exception)), None)
        if fatal is not None:
            others = [describe_exception(e) for e in errors if e is not fatal]
            note = "asyncflow: the run also failed with " + "; ".join(others)
            if others and note not in getattr(fatal, "__notes__", ()):
                fatal.add_note(note)
            return fatal
        failed = dict.fromkeys(getattr(exc, "_asyncflow_stage", "?") for exc in errors)
        where = ", ".join(repr(s) for s in failed)
        message = (f"pipeline {name!r} failed in stage {where}: "
                   f"{describe_exception(errors[0])}")
        return PipelineError(message, errors)  # type: ignore[arg-type]
    except Exception as exc:  # never leave the hand-off open for want of a message
        logger.warning("asyncflow run %r: building its error failed: %s", name,
                       format_exception(exc))
        return errors[0]


def mark_abandoned(stuck: list[str], contexts: Sequence[Any], timeout: float) -> list[str]:
    """Mark the stages labelled in ``stuck`` (their calls outlived the stop) as abandoned;
    the notes that say so, each also logged as a warning."""
    notes = []
    for label in stuck:
        for ctx in contexts:
            if ctx.name == label:
                ctx.counters.abandoned = True
        note = (
            f"stage {label!r} was abandoned: its function was still running {timeout:.1f} s "
            "after the run stopped (stuck in C code?); its daemon thread will not block "
            "interpreter exit"
        )
        logger.warning("asyncflow: %s", note)
        notes.append(note)
    return notes


def release_frames(errors: Iterable[BaseException]) -> None:
    """Clear the local variables of asyncflow's and asyncio's finished frames in the
    tracebacks of ``errors`` (their groups, causes and contexts too).

    Those frames hold the run's nodes and, through them, what the pipeline owns (persistent
    workers, batch slabs, the stages' functions): an error kept after the run (a
    ``PipelineError`` stored for later) must not keep them alive. The tracebacks still
    print in full; the locals of the user's own frames are kept, for debugging.
    """
    seen: set[int] = set()
    todo = list(errors)
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        _clear(exc.__traceback__)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)


def _clear(tb: TracebackType | None) -> None:
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith(_OURS):
            try:
                frame.clear()
            except RuntimeError:  # still running (a call abandoned on its thread)
                pass
        tb = tb.tb_next
