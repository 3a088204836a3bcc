"""What a run's consumer gets after the items: the stages' errors made into one."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from .._errors import PipelineError
from .._redact import describe_exception, format_exception

__all__ = [
    "final_error", "flatten", "make_error", "mark_abandoned", "note_stage", "release_frames",
]

logger = logging.getLogger("asyncflow")

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


def make_error(name: str, errors: list[BaseException]) -> BaseException:
    """A ``BaseException`` raised in a stage (``KeyboardInterrupt``, ``SystemExit``) as
    itself, noting the others; else a :class:`PipelineError` naming the failed stages."""
    fatal = next((e for e in errors if not isinstance(e, Exception)), None)
    if fatal is not None:
        others = [describe_exception(e) for e in errors if e is not fatal]
        note = "asyncflow: the run also failed with " + "; ".join(others)
        if others and note not in getattr(fatal, "__notes__", ()):
            fatal.add_note(note)
        return fatal
    failed: list[str] = []
    for exc in errors:
        stage = getattr(exc, "_asyncflow_stage", "?")
        if stage not in failed:
            failed.append(stage)
    where = ", ".join(repr(s) for s in failed)
    message = (
        f"pipeline {name!r} failed in stage {where}: "
        f"{describe_exception(errors[0])}"
    )
    return PipelineError(message, errors)  # type: ignore[arg-type]


def note_stage(exc: BaseException, ctx: Any) -> None:
    """Note on ``exc`` the stage (a ``NodeContext``) it failed in, once: the note, and the
    stage's name for :func:`make_error`."""
    notes = getattr(exc, "__notes__", ())
    if not any(str(n).startswith("asyncflow: stage") for n in notes):
        exc.add_note(
            f"asyncflow: stage {ctx.name!r} ({ctx.counters.kind} #{ctx.index}) failed "
            f"after producing {ctx.counters.items_out} item(s)"
        )
    if getattr(exc, "_asyncflow_stage", None) is None:
        exc._asyncflow_stage = ctx.name  # type: ignore[attr-defined]


def final_error(name: str, errors: list[BaseException]) -> BaseException | None:
    """What the consumer of run ``name`` gets after the items: ``None`` (no ``errors``), or
    :func:`make_error`'s. Never raises: should building the error fail, the first one."""
    if not errors:
        return None
    try:
        return make_error(name, errors)
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
