"""A journal's lines read back: its records, by id, whatever a crash left of the last one.

Each line of ``rank-<rank>.jsonl`` is one JSON object: a run's header (``{"run": {...}}``) or
the record of one delivered output (``asyncflow/journal/`` writes them). A crash can cut
the line being written; a later run ends a cut line before appending (``Journal._open``), so
a cut line never swallows the next one. :func:`lines` gives each line with its JSON value, or
``None`` for a cut or damaged one; :func:`record` makes a :class:`JournalRecord` of a record
line. Fields a record holds beyond the ones known here are kept in ``JournalRecord.extra``:
a later asyncflow may add some (the decoder that made a batch, say) without a change here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..pipeline import feature

__all__ = ["Failure", "JournalRecord", "TornHeader", "lines", "record"]


@dataclass(frozen=True)
class Failure:
    """An item that failed and was left out of an output."""

    position: int | None  #: its source position (``None``: not known)
    item: str  #: the item (a file, relative to the folder's root, for ``image.folder``)
    error: str  #: the error's type and message


@dataclass(frozen=True, kw_only=True)
class JournalRecord:
    """One delivered output, by its id ``(epoch, step, rank)``.

    Attributes:
        epoch, step, rank: The id.
        kind: ``"image.folder"`` or ``"pipeline"``.
        positions: The source positions behind the output, in its order (``None``: a stage
            keeps no ledger, so they are not known).
        items: ``image.folder``: ``(path relative to root, label, sample index)`` per row.
        failed: The items that failed and were left out.
        crops: ``image.folder``: the ``Crop(box, flip)`` each row got, as the run recorded
            it (drawn from the file's bytes it read; ``None`` where the file could not be
            read again after its decode; a journal written before crops were recorded:
            drawn again from the file as it is now).
        digests: ``image.folder``: a digest of each row's file, as the run read it
            (``None``: it could not be read again after its decode); :func:`rebuild`
            refuses a file that no longer matches.
        config: The run's configuration (``image.folder``: root, seed, size, train, ...).
        extra: The record's other fields, by name (fields a later asyncflow writes, such as
            the decoder that made a batch, are read without a change here).
    """

    epoch: int
    step: int
    rank: int
    kind: str
    positions: tuple[int, ...] | None
    items: tuple[tuple[str, int, int], ...] = ()
    failed: tuple[Failure, ...] = ()
    crops: tuple[Any, ...] = ()
    digests: tuple[str | None, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """``image.folder``: the paths of the images in the batch, in row order."""
        root = self.config.get("root", "")
        return [os.path.join(root, path) for path, _, _ in self.items]


@dataclass(frozen=True)
class TornHeader:
    """A run header that is not whole JSON: the line, and its start."""

    line: int
    text: str


def lines(file: Path) -> Iterator[tuple[int, str, Any]]:
    """Each line of a journal file: its number (from 1), its text, and its JSON value, or
    ``None`` where it is not whole JSON (cut by a crash: the last line, or one a later run
    ended with a newline before appending)."""
    with open(file, encoding="utf-8", errors="replace") as fh:
        for number, text in enumerate(fh, 1):
            try:
                value = json.loads(text) if text.endswith("\n") else None
            except ValueError:
                value = None
            yield number, text, value


#: The fields of a record that :class:`JournalRecord` holds; any other is in ``extra``.
_KNOWN = frozenset({"epoch", "step", "rank", "kind", "positions", "items", "failed",
                    "digests", "crops"})


def _crops(line: dict[str, Any], config: dict[str, Any]) -> tuple[Any, ...]:
    """The crops of a record's rows, read by the feature its kind registers as
    ``"journal_crops:<kind>"`` (``image.folder``'s: ``asyncflow/__init__.py`` registers it);
    a kind that registers none (``"pipeline"``) has no crops."""
    try:
        read = feature(f"journal_crops:{line['kind']}")
    except ConfigError:
        return ()
    return tuple(read(line, config))


def record(line: dict[str, Any], config: dict[str, Any]) -> JournalRecord:
    items = tuple((str(p), int(label), int(s)) for p, label, s in line.get("items", ()))
    digests = tuple(None if d is None else str(d) for d in line.get("digests", ()))
    crops = _crops(line, config)
    positions = line.get("positions")
    return JournalRecord(
        epoch=line["epoch"], step=line["step"], rank=line["rank"], kind=line["kind"],
        positions=None if positions is None else tuple(int(p) for p in positions),
        items=items, failed=tuple(Failure(*f) for f in line.get("failed", ())), crops=crops,
        digests=digests, config=config, extra={k: v for k, v in line.items() if k not in _KNOWN},
    )
