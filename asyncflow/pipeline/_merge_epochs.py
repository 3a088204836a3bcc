"""A merge's branches across restarts: the *eras* of each branch, and how they are saved.

A merge run reads each input as a branch. A policy may restart a branch that ran out
(``mix(stop="cycle" | "never")``): the branch is rebuilt as a new epoch of its input, in the
same run. Each epoch of an input that one merge run reads is an :class:`Era` of its branch:
era 0 as the run starts, era ``r`` after ``r`` restarts. A branch's items are numbered within
their era, and so are the branch run's outputs (the ordinals its lineage knows).

A branch's saved state (``{"done": ..., "eras": [...]}``, see :func:`tracks_of`) holds:

- ``done``: the lengths of the eras at its front that were settled in full (every item of
  them delivered), run-length encoded (``[[length, count], ...]``: an input of fixed length
  restarted a thousand times is one pair). A resumed run needs them only to replay its
  policy's choices: where each ran out, so that the policy is told at the same pick.
- ``eras``: each later era, the one being read last included: its input's epoch number (its
  order, its seeds), the settled source positions and stage extras of its branch run (the
  branch's own lineage state) and its items settled (``taken``). Only the eras in flight are
  listed (one, or a few when the stages after the merge hold items of an era that ran out).
  An era of a sampler source also holds the epoch the sampler drew (``sampler``): a sampler
  counts its epochs itself.

The state of a merge saved before restarts were resumable (``{"epoch", "positions", "nodes",
"taken"}`` per branch) is read as one era.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .._errors import ConfigError, check_int
from ._ledger import SourcePlan
from ._protocols import EpochSampler
from ._span import GrowingSpan, Span, is_count

__all__ = ["BranchLineage", "Era", "Track", "branch_at", "count_on", "tracks_of"]

_ERA_KEYS = frozenset({"epoch", "positions", "nodes", "taken"})
_OPTIONAL = frozenset({"sampler"})


class BranchLineage(Protocol):
    """What an era keeps of its branch run's lineage (a ``_lineage.Lineage``): the state
    behind the branch items the merge has settled, and freezing it when the run stops."""

    def snapshot(
        self, outputs: Span
    ) -> tuple[Span, dict[str, dict[str, Any]], dict[str, str]]: ...

    def freeze(self) -> None: ...


class Era:
    """One epoch of a branch's input within a merge run.

    Args:
        epoch: The input's epoch number (``-1`` until the era is built).
        taken: Its items settled before a resume: the merge passes over them.
        plan: A resumed era not built yet: where its branch starts.
    """

    __slots__ = ("epoch", "length", "lineage", "next", "outputs", "plan", "ran", "sampler",
                 "settled", "skip")

    def __init__(self, epoch: int = -1, taken: Span | None = None,
                 plan: SourcePlan | None = None, sampler: int | None = None) -> None:
        self.epoch = epoch
        self.plan = plan
        self.sampler = sampler  # the epoch a sampler source draws (it counts its own)
        self.lineage: BranchLineage | None = None  # the branch run's, once built
        self.skip = taken if taken is not None else Span()
        self.settled = GrowingSpan(self.skip.mark)  # items settled (passed over, or taken)
        self.settled.add(self.skip.ranges)
        self.outputs = GrowingSpan()  # the branch run's outputs settled
        self.next = 0  # items taken or passed over
        self.ran = 0  # the branch run's outputs taken
        self.length: int | None = None  # its items, once it ran out

    @property
    def reported(self) -> bool:
        """Whether a state lists it: built, or resumed and still to be built (an era a
        restart has begun but not built yet is left out: a resumed run starts it afresh)."""
        return self.lineage is not None or self.plan is not None


class Track:
    """One branch's eras in a merge run.

    Args:
        done: ``[length, count]`` runs: the eras settled in full before ``eras[0]``.
        eras: The eras from the first not settled in full (a new run: one, not built yet).
    """

    def __init__(self, done: list[list[int]] | None = None,
                 eras: list[Era] | None = None) -> None:
        self.done = done if done is not None else []
        self.replay = [list(run) for run in self.done]  # done eras a resumed run replays
        self.passed = 0  # items of ``replay[0]``'s era passed over so far
        self.eras = eras if eras is not None else [Era()]
        #: The era being read (until its branch is built, the one it builds: a resumed era
        #: has its epoch and ``plan``, where its branch starts; a new one neither). An
        #: object, not an index: the consumer's thread folds eras away (compacting, lock
        #: held) while the run's loop reads it without the lock.
        self.era = self.eras[0]

    def advance(self) -> None:
        """A restart: the era after the one being read (the next listed, or a new one) is
        read now (lock held); replaying, the next era settled in full, or the first
        listed."""
        if self.replay:
            self.passed = 0
            self.replay[0][1] -= 1
            if not self.replay[0][1]:
                del self.replay[0]
            return
        index = self.eras.index(self.era) + 1
        if index == len(self.eras):
            self.eras.append(Era())
        self.era = self.eras[index]

    def fold(self) -> None:
        """Count the eras settled in full at the front as done, and let them go (lock
        held): never the era being read, nor the last a state lists (a restart has begun
        the next era and not built it yet: a resumed run reads the one before to its end)."""
        while self.eras[0] is not self.era and self.eras[1].reported:
            first = self.eras[0]
            if first.length is None or first.settled.mark < first.length:
                return
            add_run(self.done, first.length)
            first.lineage = None
            del self.eras[0]


def add_run(runs: list[list[int]], length: int) -> None:
    """Append one era of ``length`` items to run-length encoded ``runs``."""
    if runs and runs[-1][0] == length:
        runs[-1][1] += 1
    else:
        runs.append([length, 1])


def branch_at(pipe: Any, era: Era) -> Any:
    """The epoch of ``pipe`` that ``era`` reads, to build as a branch
    (``PipelineCore._branch()``): a resumed era's epoch again (its order, its seeds), else
    the input's next. Runs on a worker thread (``run_plan()`` may read files).

    The branch's run carries that epoch (``current_epoch()``: an ``image.folder``'s listing
    and a cache's replay order read it), and the input's count is left as it is
    (:func:`count_on`). A sampler source draws its own epochs (``next_epoch``; a
    ``DistributedSampler`` keeps one until ``set_epoch``, as torch's does): a new era records
    the one it draws, and a resumed era sets it back.
    """
    sampler: EpochSampler | None = pipe._source.source
    if not (isinstance(sampler, EpochSampler) and isinstance(sampler.next_epoch, int)):
        sampler = None
    if era.plan is None or era.lineage is not None:  # a new era: the input's next epoch
        if sampler is not None:
            era.sampler = sampler.next_epoch
        return pipe._branch()
    if sampler is not None and era.sampler is not None:
        sampler.set_epoch(era.sampler)
    return pipe._branch(era.epoch)


def count_on(pipes: Sequence[Any], tracks: Sequence[Track]) -> None:
    """Set the epoch count of each input of a resumed merge to what it was when the state
    was taken: one past the latest epoch of its eras listed (the latest built is the era a
    branch reads, and each branch lists that one). An input merged twice counts the epochs
    of both branches, interleaved: a new era takes the number it took in the run resumed."""
    latest: dict[Any, int] = {}  # each input's SharedSource: its own count, no other
    for pipe, track in zip(pipes, tracks, strict=True):
        top = max(era.epoch for era in track.eras)
        latest[pipe._source] = max(top, latest.get(pipe._source, top))
    for source, top in latest.items():
        source.set_epoch(top + 1)


def tracks_of(state: Any, branches: int, name: str) -> list[Track] | None:
    """The branches' tracks from a merge's saved extras (``None``: not resuming).

    Raises:
        ConfigError: The extras are not what a merge's ledger saves for ``branches``
            branches (cut or edited).
    """
    if state is None:
        return None
    saved = state.get("branches") if isinstance(state, dict) else None
    if not isinstance(saved, list) or len(saved) != branches:
        raise ConfigError(f"the state of merge {name!r}: expected {branches} branches")
    tracks = []
    for index, entry in enumerate(saved):
        what = f"merge {name!r}, branch {index}"
        if isinstance(entry, dict) and set(entry) >= _ERA_KEYS and "eras" not in entry:
            entry = {"done": [], "eras": [entry]}  # saved before restarts were resumable
        if not isinstance(entry, dict) or set(entry) != {"done", "eras"}:
            raise ConfigError(f"{what}: expected done and eras")
        eras = entry["eras"]
        if not isinstance(eras, list) or not eras:
            raise ConfigError(f"{what}: eras must be a list of at least one era")
        done = _runs(entry["done"], what)
        tracks.append(Track(done, [_era(e, f"{what}, era {len(done) + i}")
                                   for i, e in enumerate(eras)]))
    return tracks


def _runs(runs: Any, what: str) -> list[list[int]]:
    if not isinstance(runs, list) or not all(
        isinstance(r, list) and len(r) == 2 and is_count(r[0]) and is_count(r[1]) and r[1]
        for r in runs
    ):
        raise ConfigError(f"{what}: done must be [length, count] pairs, got {runs!r}")
    return [list(r) for r in runs]


def _era(entry: Any, what: str) -> Era:
    if not isinstance(entry, dict) or not _ERA_KEYS <= set(entry) <= _ERA_KEYS | _OPTIONAL:
        raise ConfigError(f"{what}: expected epoch, positions, nodes, taken (and sampler)")
    epoch, nodes, sampler = entry["epoch"], entry["nodes"], entry.get("sampler", 0)
    for name, value in (("epoch", epoch), ("sampler epoch", sampler)):
        check_int(f"{what}: the {name}", value, 0)
    if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
        raise ConfigError(f"{what}: nodes must map stage names to dicts")
    positions = Span.from_json(entry["positions"], f"{what}'s positions")
    taken = Span.from_json(entry["taken"], f"{what}'s items taken")
    return Era(epoch, taken, SourcePlan(skip=positions, nodes=nodes), entry.get("sampler"))
