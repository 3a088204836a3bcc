"""Exceptions that cross a process boundary as themselves: their own type, args and
attributes, also when their ``__init__`` does not take their ``args`` back.

Python pickles an exception as ``cls(*exc.args)`` plus its ``__dict__``. An exception whose
``__init__`` takes other arguments than it passes to ``Exception.__init__`` (two arguments
and one message, say) pickles, but does not unpickle: the receiver calls ``__init__`` with
the wrong arguments. :func:`portable` then sends it by state instead, rebuilt on the other
side without calling ``__init__``; only one whose class cannot travel at all (its module
cannot be imported there, or it cannot be pickled even by value) becomes a
:class:`~asyncflow.WorkerError` that names it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from .._errors import WorkerError
from .._redact import format_exception, redact

__all__ = ["FAILED", "ChunkResult", "noted", "portable", "rebuild_exception"]


class _Failed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<FAILED>"

    def __reduce__(self) -> str:
        return "FAILED"  # one object in every process: a chunk's results come back from one


#: Marks a failed item's place in a chunk's results.
FAILED: Any = _Failed()

#: (results with FAILED at failed places, [(index, exception)], seconds spent)
ChunkResult = tuple[list[Any], list[tuple[int, BaseException]], float]


def noted(exc: BaseException) -> BaseException:
    """``exc`` with its traceback (redacted) as a note and none attached: a pickled exception
    loses its traceback, a note travels with it."""
    exc.add_note(format_exception(exc))
    exc.__traceback__ = None
    return exc


def rebuild_exception(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """An exception of type ``cls`` with ``args`` and the attributes ``state`` (its notes
    among them), made without calling ``cls.__init__``."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _ByState:
    """Pickles into a copy of ``exc`` made by :func:`rebuild_exception`."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        exc = self.exc
        return rebuild_exception, (type(exc), exc.args, dict(getattr(exc, "__dict__", {})))


def _round_trip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=5))


def portable(exc: BaseException, round_trip: Callable[[Any], Any] = _round_trip) -> Any:
    """What to pickle in place of ``exc`` (a failure going back to the parent process).

    Args:
        exc: The exception (its traceback already turned into a note: tracebacks do not
            pickle).
        round_trip: Pickles and unpickles an object as the transport will (its pickler).

    Returns:
        ``exc`` if it comes back whole; else an object that unpickles into an exception of
        its type with its args and attributes; else a :class:`WorkerError` naming it, with
        its notes.
    """
    for candidate in (exc, _ByState(exc)):
        try:
            back = round_trip(candidate)
        except Exception:
            continue
        if type(back) is type(exc):
            return candidate
    stand_in = WorkerError(redact(f"{type(exc).__qualname__}: {exc} (the exception itself "
                                  "could not be pickled back from the worker)"))
    for note in getattr(exc, "__notes__", ()):
        stand_in.add_note(note)
    return stand_in
