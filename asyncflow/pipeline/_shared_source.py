"""``SharedSource``: a pipeline's source, and the epoch count its derived pipelines share.

The count is the one owner of a pipeline's epoch: each run takes its number here
(:meth:`SharedSource.take_run`), carries it (``Run.epoch``, each stage's ``ctx.epoch`` and, in
its stage tasks, :func:`~asyncflow.pipeline.current_epoch`) and saves it in its state;
``Pipeline.set_epoch`` and ``load_state_dict`` set it. A merge branch reads the epoch of its
input that the branch's era names (:meth:`SharedSource.take_run` ``at`` it), the count left as
it was.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any, TypeAlias, TypeVar

from .._errors import ConfigError, check_int
from ._merge import Merge

__all__ = ["SharedSource", "Source", "check_source"]

T = TypeVar("T")

#: What a pipeline reads items of type ``T`` from: an iterable, an async iterable, a
#: zero-argument callable returning one (called again for each epoch), or a ``Merge`` of
#: pipelines (read as branches of the run).
Source: TypeAlias = (
    Iterable[T] | AsyncIterable[T] | Callable[[], Iterable[T] | AsyncIterable[T]] | Merge[T]
)


def check_source(where: str, source: Any) -> None:
    """Raise ``ConfigError`` unless ``source`` is an iterable, async iterable or callable."""
    if source is None or not (
        callable(source) or hasattr(source, "__iter__") or hasattr(source, "__aiter__")
    ):
        raise ConfigError(
            f"{where}: the source must be an iterable, an async iterable or a "
            f"zero-argument callable returning one; got {type(source).__name__}"
        )


class SharedSource:
    """The user's source plus what all pipelines derived from it share: the epoch count, and
    whether a one-shot iterator has been used up. ``epoch``: the first run's number;
    ``start``: the position in the epoch of the source's first item (``with_source``)."""

    def __init__(self, source: Any, *, epoch: int = 0, start: int = 0) -> None:
        self.source = source
        # A class (``itertools.count``) is a factory even though it defines __iter__.
        self.is_factory = isinstance(source, type) or (callable(source) and not (
            hasattr(source, "__iter__") or hasattr(source, "__aiter__")
        ))
        self.one_shot = not self.is_factory and (
            (hasattr(source, "__next__") and iter(source) is source)
            or (hasattr(source, "__anext__"))
        )
        self.runs = epoch
        self.first = epoch  # the first run's epoch number (with_source may start later)
        self.resume_offset = start
        self.resume_plan: Any = None  # a SourcePlan from load_state_dict(), for the next run
        self.lock = threading.Lock()

    def set_epoch(self, epoch: int) -> None:
        """Number the next run ``epoch``; later runs count on from it.

        Raises:
            ConfigError: ``epoch`` is not an int >= 0.
        """
        with self.lock:
            self.runs = check_int("epoch", epoch, 0)

    def take_run(self, *, resume: bool = True, at: int | None = None) -> tuple[int, Any, int]:
        """The next run's epoch, resume plan (``None`` if none, or not ``resume``: a merge
        branch's) and start offset, taken together: of two runs starting at once, one
        resumes and the other reads the next epoch.

        Args:
            resume: Take the resume plan ``load_state_dict`` left (a merge branch does not).
            at: Run epoch ``at`` instead of the next, leaving the count as it is (a resumed
                merge branch's era: the epoch of its input it read, which a one-shot
                iterator given to a new pipeline still holds).

        Raises:
            ConfigError: A one-shot iterator was read by an earlier run.
        """
        with self.lock:
            if at is None:
                epoch, self.runs = self.runs, self.runs + 1
            else:
                epoch = at
            plan = None
            if resume:
                plan, self.resume_plan = self.resume_plan, None
            offset, self.resume_offset = self.resume_offset, 0
        if self.one_shot and at is None and epoch > self.first:
            raise ConfigError(
                f"the source {type(self.source).__name__} is an iterator, so it can be read "
                "once, and an earlier run has read it; pass a list, or a zero-argument "
                "callable that returns a fresh iterable, to iterate more than one epoch"
            )
        return epoch, plan, offset

    def open(self) -> Any:
        if not self.is_factory:
            return self.source
        source = self.source()
        if not (hasattr(source, "__iter__") or hasattr(source, "__aiter__")):
            raise ConfigError(
                f"the source callable {getattr(self.source, '__name__', self.source)!r} "
                f"returned {type(source).__name__}, not an iterable or async iterable"
            )
        return source

    def describe(self) -> dict[str, Any]:
        source = self.source
        if isinstance(source, Merge):
            return source.describe()
        info: dict[str, Any] = {"type": type(source).__name__}
        if self.is_factory:
            info["callable"] = getattr(source, "__qualname__", None) or type(source).__qualname__
        with contextlib.suppress(TypeError):  # a source without a length
            info["len"] = len(source)
        return info
