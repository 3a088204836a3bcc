"""What a run's consumer gets after the items: the stages' errors made into one."""

from __future__ import annotations

from .._errors import PipelineError
from .._redact import describe_exception

__all__ = ["flatten", "make_error"]


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
