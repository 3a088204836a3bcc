"""The whole asyncflow exception hierarchy.

Exception hierarchy::

    * AsyncflowError
      x ConfigError(ValueError)          a bad spec or argument, raised when it is given
        + ConfigTypeError(TypeError)     an argument of the wrong type
      x SourceError                      reading an item failed (names the URL or path)
        + SourceNotFound(FileNotFoundError)
        + SourceTimeout(TimeoutError)
        + SourcePermissionError(PermissionError)
      x DecodeError(ValueError)          a file or buffer is not a decodable image (names it)
      x StallError(TimeoutError)         a stage made no progress for longer than allowed
        + LoaderTimeout(RuntimeError)    no batch within a DataLoader's timeout (torch's type)
      x FailureBudgetExceeded            a stage failed on more items than max_failures
                                         allows (``.failures`` lists them)
      x WorkerError(RuntimeError)        a worker process died, or could not start (names it)
      x PipelineError(ExceptionGroup)    one or more stages failed; each exception carries a
                                         note naming the stage and the item

    * RebuildWarning(UserWarning)        a batch was made again within a tolerance of the
                                         original, not bit for bit (a GPU-decoded batch)

Every class mixes in the built-in exception a caller would naturally catch, so
``except ValueError`` still catches a :class:`ConfigError`. ``asyncio.CancelledError`` is
never wrapped. Messages and reprs are redacted (no credentials, signatures or keys).

Beside the tree, the one check of each kind of argument every layer takes: :func:`check_int`
(an int, not a bool, maybe with a floor), :func:`check_bool`, :func:`check_seconds` (a finite
number of seconds) and :func:`check_budget` (a failure budget). Their errors name the argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._redact import redact

_T = TypeVar("_T")

__all__ = [
    "AsyncflowError",
    "ConfigError",
    "ConfigTypeError",
    "DecodeError",
    "FailureBudgetExceeded",
    "LoaderTimeout",
    "PipelineError",
    "RebuildWarning",
    "SourceError",
    "SourceNotFound",
    "SourcePermissionError",
    "SourceTimeout",
    "StallError",
    "WorkerError",
]


class AsyncflowError(Exception):
    """Base class of every error asyncflow raises on its own account."""


class ConfigError(AsyncflowError, ValueError):
    """An invalid pipeline spec or option, raised when the method is called."""


class ConfigTypeError(ConfigError, TypeError):
    """An option of the wrong type (``replacement=0`` where a bool belongs): a
    :class:`ConfigError` that is also the ``TypeError`` torch raises for it."""


class SourceError(AsyncflowError):
    """Reading an item failed; the message names the (redacted) URL or path."""


class SourceNotFound(SourceError, FileNotFoundError):
    """The file, object or URL does not exist (404, ``NoSuchKey``, ``ENOENT``)."""


class SourcePermissionError(SourceError, PermissionError):
    """Access was refused (401, 403, ``AccessDenied``, ``EACCES``)."""


class SourceTimeout(SourceError, TimeoutError):
    """A connect, read or total deadline passed."""


class DecodeError(AsyncflowError, ValueError):
    """The data is not a decodable image; the message names the file or URL."""


class StallError(AsyncflowError, TimeoutError):
    """A stage with work in hand produced nothing for longer than ``stall_timeout``."""


class LoaderTimeout(StallError, RuntimeError):
    """No batch arrived within a DataLoader's ``timeout``: a :class:`StallError` (a
    ``TimeoutError``) that is also the ``RuntimeError`` torch's DataLoader raises."""


class WorkerError(AsyncflowError, RuntimeError):
    """A worker process died (a segfault, the OOM killer) or could not start; the message names
    the worker, the stage and the item it held."""


@dataclass(frozen=True)
class FailureRecord:
    """One skipped or fatal item: where it failed, on what, and why (public as
    ``asyncflow.pipeline.FailureRecord``; kept here, beside the error that carries it)."""

    stage: str
    item: str
    error_type: str
    message: str


class FailureBudgetExceeded(AsyncflowError):
    """A stage failed on more items than its ``max_failures`` allows, or on every item.

    Attributes:
        stage: The stage's name.
        failures: The stage's recorded failures (:class:`~asyncflow.pipeline.FailureRecord`:
            item, exception type and redacted message; the first 10,000).
    """

    def __init__(
        self, message: str, *, stage: str, failures: Sequence[FailureRecord] = ()
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.failures: tuple[FailureRecord, ...] = tuple(failures)

    def __reduce__(self) -> Any:
        return _rebuild_budget_error, (str(self), self.stage, self.failures)


def _rebuild_budget_error(
    message: str, stage: str, failures: tuple[FailureRecord, ...]
) -> FailureBudgetExceeded:
    return FailureBudgetExceeded(message, stage=stage, failures=failures)


class PipelineError(AsyncflowError, ExceptionGroup):  # type: ignore[type-arg,unused-ignore]
    """One or more stages failed.

    An :class:`ExceptionGroup`: ``except* DecodeError`` picks out the decode failures, and
    each exception carries a note (``exc.__notes__``) naming the stage and the item. The
    original exceptions keep their tracebacks.
    """

    def __new__(cls, message: str, exceptions: Sequence[Exception]) -> PipelineError:
        return super().__new__(cls, redact(message), exceptions)

    def __repr__(self) -> str:
        # The group's repr holds its exceptions' reprs: a stage's raw error text.
        return redact(super().__repr__())

    def derive(self, excs: Sequence[Any]) -> PipelineError:  # type: ignore[override]
        return PipelineError(self.message, excs)


def check_int(name: str, value: _T, low: int | None = 1, *, allow_none: bool = False) -> _T:
    """``value``, once it is an int (not a bool) of at least ``low`` (any int for ``None``),
    or ``None`` where ``allow_none``.

    Raises:
        ConfigTypeError: ``value`` is not an int (``True``, ``1.5``, ``"3"``).
        ConfigError: ``value`` is below ``low``. Both messages name the argument ``name``.
    """
    if value is None and allow_none:
        return value
    want = f"an int{'' if low is None else f' >= {low}'}{' or None' if allow_none else ''}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(f"{name} must be {want}, got {value!r:.80}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be {want}, got {value!r:.80}")
    return value


def check_bool(name: str, value: _T, *, allow_none: bool = False) -> _T:
    """``value``, once it is ``True`` or ``False`` (or ``None`` where ``allow_none``).

    Raises:
        ConfigTypeError: It is not (``"no"`` or ``1`` would read as true); names ``name``.
    """
    if isinstance(value, bool) or (value is None and allow_none):
        return value
    want = "True, False or None" if allow_none else "True or False"
    raise ConfigTypeError(f"{name} must be {want}, got {value!r:.80}")


def check_flags(owner: object, *names: str) -> None:
    """Refuse any of ``owner``'s attributes ``names`` that is not a ``bool``.

    Raises:
        ConfigTypeError: Names the first one that is not (``"yes"`` or ``1`` would read as
            true).
    """
    for name in names:
        check_bool(name, getattr(owner, name))


def check_seconds(
    name: str, value: _T, *, zero: bool = False, allow_none: bool = False,
    infinite: bool = False,
) -> _T:
    """``value``, once it is a finite number of seconds (an int or float, not a bool) above 0,
    or 0 too where ``zero``; or ``None`` (no limit) where ``allow_none``; or infinity (no
    limit) where ``infinite``.

    Raises:
        ConfigTypeError: ``value`` is not a number (``True``, ``"1"``).
        ConfigError: It is NaN, infinite where not ``infinite``, or out of range. Both
            messages name ``name``.
    """
    if value is None and allow_none:
        return value
    want = (f"a {'' if infinite else 'finite '}number of seconds {'>=' if zero else '>'} 0"
            f"{' or inf' if infinite else ''}{' or None' if allow_none else ''}")
    number = _number(name, value, want)
    if not (0 <= number < math.inf or (infinite and number == math.inf)) or (
            value == 0 and not zero):
        raise ConfigError(f"{name} must be {want}, got {value!r:.80}")
    return value


def check_budget(name: str, value: _T, *, allow_none: bool = False) -> _T:
    """``value``, once it is a failure budget: an int >= 0 (failures allowed) or a float in
    [0, 1] (a fraction of the items); or ``None`` (the default budget) where ``allow_none``.

    Raises:
        ConfigTypeError: ``value`` is not a number (``True``, ``"1"``).
        ConfigError: It is out of range, or NaN. Both messages name ``name``.
    """
    if value is None and allow_none:
        return value
    want = f"an int >= 0 or a float in [0, 1]{' or None' if allow_none else ''}"
    if not 0 <= _number(name, value, want) <= (1 if isinstance(value, float) else math.inf):
        raise ConfigError(f"{name} must be {want}, got {value!r:.80}")
    return value


def check_fraction(name: str, value: _T, *, low: float, high: float) -> _T:
    """``value``, once it is a number (an int or float, not a bool) from ``low`` to ``high``.

    Raises:
        ConfigTypeError: ``value`` is not a number (``True``, ``"1"``).
        ConfigError: It is out of range, or NaN. Both messages name ``name``.
    """
    want = f"a number from {low} to {high}"
    if not low <= _number(name, value, want) <= high:
        raise ConfigError(f"{name} must be {want}, got {value!r:.80}")
    return value


def _number(name: str, value: Any, want: str) -> int | float:
    # NaN then fails every comparison; an int compares with inf exactly, however large
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigTypeError(f"{name} must be {want}, got {value!r:.80}")
    return value


class RebuildWarning(UserWarning):
    """``asyncflow.rebuild`` made a batch again within a stated tolerance of the original, not
    bit for bit: it was decoded on the GPU, and is rebuilt on the CPU."""


# Errors print as ``asyncflow.DecodeError``, the name users import and catch, not as the
# private module's ``asyncflow._errors.DecodeError``; pickles name that public path too.
for _name in __all__:
    globals()[_name].__module__ = "asyncflow"
del _name
