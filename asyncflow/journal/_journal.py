"""The journal: which source items made each delivered batch, and that batch made again.

``pipe.journal(path)`` adds a consumer-side hook (:meth:`~asyncflow.Pipeline.with_hook`) that
writes one JSON line per delivered output to ``path/rank-00000.jsonl`` (one file per rank,
rank from ``torch.distributed`` or ``$RANK``): its id ``(epoch, step, rank)``, the source
positions behind it and the items that failed in it. :func:`explain` reads a record back by
its id; :func:`rebuild` runs the pipeline again on exactly those items.

Where the positions come from:

* ``image.folder``: its batch assembler notes each released batch (listing, number, failed
  rows); the step is the batch's number in the epoch, the positions its rows' places in the
  epoch's order (``asyncflow/image/_explain.py``), and the record names the files, labels
  and decode errors, with a digest of each file's bytes and the crop and flip it got.
* Any other pipeline: the run's lineage (``Lineage.trace``) while the output is in flight;
  the journal holds the lineage's compaction back to the output it will trace next
  (``Lineage.hold``). The step counts the epoch's outputs in delivery order; a run that
  resumes an epoch counts on from the records of it whose positions the state had settled.
  Failures are those the stages reported while the output was being made.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError, check_int
from .._redact import describe_item
from ..ranks import world
from ._protocol import Journaled
from ._records import Failure, JournalRecord, TornHeader, lines, record

__all__ = ["Failure", "Journal", "JournalRecord", "explain", "rebuild"]

#: Failures kept while they wait for the output they fall in.
_PENDING = 1024


def _file(path: str | os.PathLike[str], rank: int) -> Path:
    return Path(path) / f"rank-{rank:05d}.jsonl"


class Journal:
    """A hook factory for :meth:`~asyncflow.Pipeline.with_hook` that journals every output
    (``pipe.journal(path)`` makes one): one file per rank, appended to line by line.

    Args:
        pipe: The pipeline it journals (``image.folder`` records files and crops).
        path: A folder; this rank writes ``rank-<rank>.jsonl`` in it.
        rank: This process's rank (default: ``torch.distributed``'s, else ``$RANK``, else 0).
    """

    def __init__(self, pipe: Any, path: str | os.PathLike[str], *, rank: int | None = None):
        self.rank = check_int("rank", rank, 0, allow_none=True)
        self.pipe = pipe
        self.path = Path(path)

    def file(self) -> Path:
        """This rank's journal file."""
        return _file(self.path, world()[0] if self.rank is None else self.rank)

    def _open(self) -> int:
        """This rank's file, to append to (a descriptor): each line goes out in one
        ``O_APPEND`` write, so a crash loses at most the output in hand, and two runs
        appending at once do not interleave their lines."""
        file = self.file()
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A run that crashed mid-line left it cut: end it, so that this run's lines
                # stay lines of their own (readers skip the cut one).
                os.write(fd, b"\n")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def __call__(self, run: Any) -> _Hook:
        return _Hook(self, run)


class _Hook:
    """One run's journal: called on each output in the consumer's thread."""

    def __init__(self, journal: Journal, run: Any) -> None:
        self.journal, self.rank = journal, world()[0] if journal.rank is None else journal.rank
        own = isinstance(journal.pipe, Journaled)
        self.config: dict[str, Any] | None = journal.pipe.journal_begin() if own else None
        # A library pipeline that journals its own outputs, with stages after them that make
        # new ones: its lineage's positions are not the items (image.folder's are groups).
        self.untraced = own and self.config is None
        self.cache: dict[int, Any] = {}
        lineage = run.lineage
        assert lineage is not None  # hooks are made as the run starts
        self.lineage, self.epoch, self.ordinal = lineage, run.epoch, 0
        self.lineage.hold(0)
        self.run = run
        self.seen = [len(records) for records in run.failure_records()]
        self.pending: list[list[Any]] = []  # failures not yet placed in an output
        self.top = -1  # the highest position of the outputs so far
        self.source = _positional(journal.pipe.source)
        self.step = self._resumed_steps(lineage.resumed)
        # Closed by close(), or when the hook is collected (a run abandoned unclosed).
        self.fd = journal._open()
        self._close = weakref.finalize(self, os.close, self.fd)
        self._write({"run": {"epoch": run.epoch, "rank": self.rank,
                             "config": self.config or {"kind": "pipeline"}}})

    def _write(self, line: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def _resumed_steps(self, plan: Any) -> int:
        """The outputs of this epoch delivered before the state this run resumes from."""
        if plan.base == 0 and not plan.skip.ranges:
            return 0
        file = self.journal.file()
        if not file.exists():
            return 0
        steps = set()
        for number, _, line in lines(file):
            if not isinstance(line, dict) or line.get("epoch") != self.epoch \
                    or not isinstance(line.get("positions"), list):
                continue
            try:
                if all(p < plan.base or p in plan.skip for p in line["positions"]):
                    steps.add(line["step"])
            except (KeyError, TypeError) as exc:  # an edited line (a cut one is None)
                raise ConfigError(f"{file}:{number}: the record of an output of epoch "
                                  f"{self.epoch} is damaged ({exc!r}), so the steps this "
                                  "resumed run counts on from are unknown") from None
        return len(steps)

    def __call__(self, item: Any) -> Any:
        line = None
        if self.config is not None:
            line = self.journal.pipe.journal_entry(item, self.cache)
            if line is not None:
                line = {**line, "rank": self.rank, "kind": self.config["kind"]}
        if line is None:
            positions = None if self.untraced else self.lineage.trace(self.ordinal)
            line = {"epoch": self.epoch, "step": self.step, "rank": self.rank,
                    "kind": "pipeline", "positions": positions,
                    "failed": self._failures(positions)}
            self.step += 1
        self.ordinal += 1
        self.lineage.hold(self.ordinal)
        self._write(_ordered(line))
        return item

    def _failures(self, positions: list[int] | None) -> list[list[Any]]:
        """The failures reported so far that fall in this output: each a source position
        left out between the previous outputs' highest position and this one's highest,
        whose item the failure names. Unplaced ones wait for a later output."""
        for index, records in enumerate(self.run.failure_records()):
            self.pending.extend([None, r.item, f"{r.error_type}: {r.message}"]
                                for r in records[self.seen[index]:])
            self.seen[index] = len(records)
        del self.pending[:-_PENDING]  # never placed (an item whose text differs): dropped
        if not positions:
            return []
        top, self.top = self.top, max(self.top, *positions)
        if not self.pending:
            return []
        inside, length = set(positions), _length(self.source)
        out = []
        for position in range(top + 1, min(self.top, length)):
            if position in inside:
                continue
            text = describe_item(self.source[position])  # as the engine's failure records
            match = next((f for f in self.pending if f[1] == text), None)
            if match is not None:
                self.pending.remove(match)
                out.append([position, match[1], match[2]])
        return out

    def close(self) -> None:
        self.lineage.hold(1 << 62)  # effectively off: compaction follows the consumer again
        self._close()


def _positional(source: Any) -> Any:
    """``source`` as its items by position: a mapping's are its keys (what it yields)."""
    return list(source) if isinstance(source, Mapping) else source


def _length(source: Any) -> int:
    try:
        return len(source) if hasattr(source, "__getitem__") else 0
    except TypeError:
        return 0


def _ordered(line: dict[str, Any]) -> dict[str, Any]:
    """The id first, so that :func:`explain` finds a line by its prefix, unparsed."""
    head = {"epoch": line["epoch"], "step": line["step"], "rank": line["rank"]}
    return {**head, **{k: v for k, v in line.items() if k not in head}}


def explain(source: str | os.PathLike[str] | Journal, *, epoch: int, step: int,
            rank: int = 0) -> JournalRecord:
    """The record of output ``(epoch, step, rank)``: its source positions, items, failures
    and, for ``image.folder``, the crop and flip each image got.

    Args:
        source: The journal's folder (as given to ``pipe.journal``), or the :class:`Journal`.
        epoch, step, rank: The output's id (``step``: its number in the epoch, from 0).

    Returns:
        The latest record with that id (a resumed run writes again what it delivers again).

    A crash can cut the line being written: a cut record is skipped (the records before it
    are read as usual), and a lookup of it raises ``LookupError`` saying so; a cut run header
    fails only the lookups of the records after it.

    Raises:
        LookupError: The journal holds no such output, or its record is cut.
        ConfigError: The record, or the header of the run that wrote it, is damaged or cut
            (the message names the file and line).

    Cancellation:
        Blocks while it reads the journal file (and, for ``image.folder``, each image's
        header): call it from a thread (``asyncio.to_thread``) in async code.
    """
    folder = source.path if isinstance(source, Journal) else Path(source)
    file = _file(folder, rank)
    prefix = f'{{"epoch":{epoch},"step":{step},"rank":{rank},'
    found: tuple[int, dict[str, Any], Any] | None = None
    current: Any = {}
    cut: int | None = None  # the line of a cut record of this output
    if file.exists():
        for number, text, value in lines(file):
            if text.startswith('{"run":'):
                run = value.get("run") if isinstance(value, dict) else None
                if not (isinstance(run, dict) and isinstance(run.get("config"), dict)):
                    current = TornHeader(number, text)  # its records cannot be read
                    continue
                current = run["config"]
            elif text.startswith(prefix):
                if isinstance(value, dict):
                    found = (number, value, current)
                else:
                    cut = number
    if found is None:
        if cut is not None:
            raise LookupError(f"{file}:{cut}: the record of output (epoch={epoch}, "
                              f"step={step}, rank={rank}) is cut (its run stopped while "
                              "writing it)")
        raise LookupError(f"{file} holds no output (epoch={epoch}, step={step}, rank={rank})")
    number, line, config = found
    if isinstance(config, TornHeader):
        raise ConfigError(f"{file}:{config.line}: the header of the run that wrote output "
                          f"(epoch={epoch}, step={step}, rank={rank}) is cut or damaged "
                          f"({config.text[:60]!r}...): its configuration is lost")
    try:
        return record(line, config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{file}:{number}: the record of output (epoch={epoch}, "
                          f"step={step}, rank={rank}) is damaged ({exc!r})") from None


def rebuild(pipe: Any, record: JournalRecord) -> Any:
    """The output ``record`` names, made again offline from its source items, bit for bit.

    ``image.folder``: its kept images decoded again with the same ``(seed, epoch, item)``
    key, in the recorded row order, each from a file that still holds the bytes the run
    decoded (its recorded digest). Any other pipeline: run again on a source of just the
    record's positions (the pipeline's source must be a sequence), which gives the same
    output when every stage is deterministic per item.

    Raises:
        SourceError: ``image.folder``: a file changed since the run (it is named).
        ConfigError: It cannot be rebuilt: the positions are unknown, a stage's output
            depends on more than its own items (it is named: a shuffle, an unordered map, a
            stage that splits or a custom one), the source is not a sequence, or the pipeline
            is not the one recorded.

    Cancellation:
        Blocks until the output is made (it decodes, or runs the pipeline to its end): call
        it from a thread in async code. Interrupting it stops the run it started.
    """
    if record.kind != "pipeline":  # a pipeline that journals its own outputs made it
        if not isinstance(pipe, Journaled):
            raise ConfigError(f"this record was made by {record.kind}: pass that pipeline")
        items = [list(i) for i in record.items]
        if len(record.digests) == len(items):  # each file must hold the bytes decoded
            items = [[*i, d] for i, d in zip(items, record.digests, strict=True)]
        return pipe.journal_rebuild(record.config, record.epoch, items)
    if record.positions is None:
        raise ConfigError("the journal holds no positions for this output: a stage kept no "
                          "ledger (see Pipeline.state_dict for which)")
    for stage, spec in zip(pipe.describe()[1:], pipe.stages, strict=True):
        traits = spec.traits  # a run on the recorded items alone makes the output again?
        if not traits.replayable:
            why = "unordered" if traits.per_item and not traits.ordered else \
                f"a {stage['kind']} stage"
            raise ConfigError(f"cannot rebuild: stage {stage['name']!r} is {why}, so an output "
                              "depends on more than its own items (or on their timing)")
    source = _positional(pipe.source)
    if not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
        raise ConfigError(f"cannot rebuild: the source ({type(source).__name__}) is not a "
                          "sequence to take the recorded positions from")
    positions = list(record.positions)
    start = positions[0] if positions else 0
    contiguous = positions == list(range(start, start + len(positions)))
    again = pipe.without_hooks().with_source(
        [source[p] for p in positions], epoch=record.epoch, start=start if contiguous else 0)
    with again.open() as run:  # an interrupt leaves the block: the run is stopped
        outputs = list(run)
    if len(outputs) != 1:
        raise ConfigError(f"rebuilding made {len(outputs)} outputs from the recorded items, "
                          "not 1: the pipeline is not the one recorded")
    return outputs[0]
