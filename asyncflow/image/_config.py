"""``image.folder``'s settings: its arguments checked, and where its decoders run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .._errors import ConfigError, ConfigTypeError
from .._split import Part, Split
from ..pipeline import Processes, choose_workers, usable_cpus
from ._rows import DecodeIntoSharedRow

__all__ = ["check_arguments", "decode_workers", "resolve_split"]


def check_arguments(
    batch_size: Any, mean: Sequence[float], std: Sequence[float], decode_concurrency: Any
) -> int:
    """Check ``image.folder``'s numeric arguments; return how many decoders to run (the
    CPUs this process may use unless ``decode_concurrency`` says).

    Raises:
        ConfigError: ``batch_size`` or ``decode_concurrency`` is not an int >= 1, or ``mean``
            and ``std`` are not 3 values each (``std`` positive).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
        raise ConfigError(f"mean and std need 3 values (std > 0), got {tuple(mean)}, {tuple(std)}")
    if decode_concurrency is None:
        return usable_cpus()
    if (isinstance(decode_concurrency, bool) or not isinstance(decode_concurrency, int)
            or decode_concurrency < 1):
        raise ConfigError(f"decode_concurrency must be an int >= 1, got {decode_concurrency!r}")
    return decode_concurrency


def decode_workers(workers: Any, count: int) -> tuple[Processes | None, str | None]:
    """Processes (persistent: they belong to the pipeline) or threads (``None``) for
    ``count`` decoders, and why, when ``workers="auto"`` chose.

    Raises:
        ConfigError: ``workers`` is not ``"auto"``, ``"threads"``, ``"processes"`` or a
            :class:`~asyncflow.Processes`.
    """
    if workers == "threads":
        return None, None
    if workers == "auto":
        chosen, note = choose_workers(DecodeIntoSharedRow(0, {}, (1,), "uint8"), count,
                                      stage="decode")
        if chosen is None:
            return None, note
        return replace(chosen, persistent=True), note
    if workers == "processes":
        workers = Processes(persistent=True)
    if not isinstance(workers, Processes):
        raise ConfigError(
            f"workers must be 'auto', 'threads', 'processes' or an asyncflow.Processes, got "
            f"{workers!r:.80}"
        )
    return workers, None


def resolve_split(split: Any) -> Part | None:
    """This process's part of the tree (resolved now), or ``None`` for all of it.

    ``image.folder`` is one pipeline per rank, never one per DataLoader worker, so the
    workers are not counted.

    Raises:
        ConfigTypeError: ``split`` is not an :class:`~asyncflow.Split`.
        ConfigError: The split's rank or world size is invalid (see :meth:`Split.part`), or
            it shuffles (``image.folder`` has its own ``shuffle=``).
    """
    if split is None:
        return None
    if not isinstance(split, Split):
        raise ConfigTypeError(f"split must be an asyncflow.Split, got {split!r:.80}")
    if split.shuffle:
        raise ConfigError("image.folder shuffles with its own shuffle= and seed=; give it a "
                          f"Split without shuffle, got {split!r}")
    return replace(split, workers=False).part()
