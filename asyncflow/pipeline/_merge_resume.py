"""A merge's lineage: which branch items lie behind the merge's settled outputs, and how a
resumed merge replays its policy's choices.

The merge's outputs play the part of a source's positions (its ledger is a
:class:`~asyncflow.pipeline._lineage.SourceLedger`: a resumed run's outputs leave the settled
ones out). Each output is also recorded as item ``k`` of an *era* of branch ``b`` (an epoch of
its input within the merge run: a restart begins the next, see *Eras* below) and as that era's
branch-run output ordinal, until it is settled. The state holds, per branch, the lengths
of the eras settled in full, and for each later era its input's epoch, the branch's own
lineage state (settled source positions and stage extras, from the branch's ledgers) and the
era's items settled (``taken``: a watermark plus ranges).

Resuming, the merge asks its policy for the same choices again (they are reproducible: a
policy depends on its seed and the epoch), from the first. A choice of branch ``b`` in an era
settled in full is passed over, and the choice just past that era's length is where the branch
ran out: the policy is told so (``ended``), as it was then, and must restart it. In a listed
era, a choice whose next item ``k`` was settled is passed over and any other takes the
branch's next item; the branch is built at the era's epoch with its settled positions left out,
and restarts into the next listed era, then into new ones. So the merge yields exactly the
items not yet delivered, in the uninterrupted run's order (where the branches keep order), and
a branch reads each epoch its input would have read. Replaying costs one choice per item
already delivered in the merge run, at the resumed run's start (about 1.5 us each).

**Eras**, a merge's branches across restarts. A merge run reads each input as a branch. A
policy may restart a branch that ran out (``mix(stop="cycle" | "never")``): the branch is
rebuilt as a new epoch of its input, in the same run. Each epoch of an input that one merge run
reads is an :class:`Era` of its branch: era 0 as the run starts, era ``r`` after ``r``
restarts. A branch's items are numbered within their era, and so are the branch run's outputs
(the ordinals its lineage knows).

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
from ._ledger import SourceLedger, SourcePlan
from ._protocols import EpochSampler
from ._span import GrowingSpan, Span, is_count, runs

__all__ = ["END", "PASS", "SKIP", "TAKE", "BranchLineage", "Era", "MergeLedger", "Track",
           "branch_at", "count_on", "tracks_of"]

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

    def outputs_settled(self) -> int:
        """The branch run's outputs settled, every one below it (its lineage compacts up to
        it)."""
        return self.outputs.mark

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
        #: The era being read. An object, not an index: the consumer's thread folds eras
        #: away (compacting, lock held) while the run's loop reads it without the lock.
        self.era = self.eras[0]

    def advance(self) -> None:
        """A restart: the era after the one being read (the next listed, or a new one) is
        read now (lock held)."""
        index = self.eras.index(self.era) + 1
        if index == len(self.eras):
            self.eras.append(Era())
        self.era = self.eras[index]

    def pending(self) -> bool:
        """Whether eras listed in a resumed state come after the one being read (lock held)."""
        return self.eras[-1] is not self.era

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


#: What a choice of a branch is to a merge (:meth:`MergeLedger.pick`): take the branch's next
#: item; pass over an item settled before a resume; pass over one of an era settled in full;
#: the end of such an era (tell the policy the branch ran out).
TAKE, PASS, SKIP, END = range(4)


class MergeLedger(SourceLedger):
    """The merge node's ledger (its outputs are the run's positions), and per output in
    flight its branch, era, the era's item number and the branch run's output ordinal.

    Args:
        plan: The run's source plan (a resumed run: the merge outputs settled before).
        branches: How many inputs the merge has.
        tracks: Each branch's saved eras (:func:`tracks_of`), or ``None`` (a new epoch).
        name: The merge's name, for errors.
    """

    def __init__(self, plan: SourcePlan, branches: int, tracks: list[Track] | None = None,
                 *, name: str = "merge") -> None:
        super().__init__(plan)
        self.name = name
        self.resumed = tracks is not None
        self.tracks = tracks if tracks is not None else [Track() for _ in range(branches)]
        self.picks: list[tuple[int, Era, int, int]] = []  # (branch, era, item, ordinal) from
        self.first_out = 0  # this output ordinal on
        self._on = False  # until the run's lineage says whether it keeps records
        self._keeps: bool | None = None

    @property
    def on(self) -> bool:
        """Whether records are kept: set by the run's lineage (``Lineage.attach``), turned
        off when the run stops. Turned off, it turns its branches' records off too (a run
        that keeps none: a stage after the merge keeps no ledger; a merge within a merge)."""
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        if self._keeps is None:
            self._keeps = value
        if not value:
            for lineage in self.lineages:
                lineage.freeze()
        self._on = value

    @property
    def keeps(self) -> bool:
        """Whether a branch built now keeps records (the run's state can be taken)."""
        return self._keeps is True

    @property
    def lineages(self) -> list[BranchLineage]:
        """The lineages of the eras still held."""
        return [e.lineage for t in self.tracks for e in t.eras if e.lineage is not None]

    # -- on the run's loop ----------------------------------------------------------------

    def upcoming(self, branch: int) -> Era:
        """The era ``branch`` builds next: a resumed one has its epoch and ``plan`` (where
        its branch starts), a new one neither."""
        return self.tracks[branch].era

    def built(self, pipes: Sequence[Any]) -> None:
        """The first eras of the branches (over ``pipes``) are built: a resumed merge's
        inputs count their epochs on from where they were when the state was taken."""
        if self.resumed:
            count_on(pipes, self.tracks)

    def install(self, branch: int, ctx: Any) -> None:
        """The era ``branch`` reads now was built: ``ctx`` is its last stage's context."""
        era = self.tracks[branch].era
        with self.lock:
            era.epoch, era.lineage, era.plan = ctx.epoch, ctx.lineage, None
        ctx.lineage.follow(era.outputs_settled)

    def pick(self, branch: int) -> int:
        """What a choice of ``branch`` is: :data:`TAKE`, :data:`PASS`, :data:`SKIP` or
        :data:`END` (a pass is counted here)."""
        track = self.tracks[branch]
        if track.replay:
            if track.passed < track.replay[0][0]:
                track.passed += 1
                return SKIP
            return END
        era = track.era
        item, skip = era.next, era.skip
        if item < skip.mark or (skip.ranges and item in skip):
            era.next = item + 1
            return PASS
        return TAKE

    def replay_empty(self, branch: int) -> bool:
        """Whether the era settled in full that :data:`END` ended had no items."""
        return self.tracks[branch].replay[0][0] == 0

    def replayed(self, branch: int, verdict: str) -> None:
        """The policy's verdict where an era settled in full ran out: it must restart.

        Raises:
            ConfigError: It did not (the state is from another policy or seed).
        """
        if verdict != "restart":
            self._differs(branch, verdict)
        track = self.tracks[branch]
        track.passed = 0
        track.replay[0][1] -= 1
        if not track.replay[0][1]:
            del track.replay[0]

    def take(self, branch: int) -> None:
        """The merge took ``branch``'s next item, to put it out (recorded before it is)."""
        era = self.tracks[branch].era
        item, ordinal = era.next, era.ran
        era.next, era.ran = item + 1, ordinal + 1
        self.emitted += 1
        if self._on:
            with self.lock:
                self.picks.append((branch, era, item, ordinal))
            self.grew(1)

    def ran_out(self, branch: int) -> None:
        """The era ``branch`` reads has run out: its length is known."""
        era = self.tracks[branch].era
        with self.lock:
            era.length = era.next

    def ended(self, branch: int, verdict: str) -> None:
        """The policy's verdict on ``branch``, which ran out: a restart begins its next era.

        Raises:
            ConfigError: A resumed run's policy ended a branch that its state says restarted.
        """
        track = self.tracks[branch]
        with self.lock:
            if verdict == "restart":
                track.advance()
                return
            pending = track.pending()
        if pending:
            self._differs(branch, verdict)

    def _differs(self, branch: int, verdict: str) -> None:
        raise ConfigError(
            f"the state of merge {self.name!r} does not fit its policy: branch {branch} "
            f"restarted at this point in the run the state was taken from, and the policy "
            f"now says {verdict!r} (another policy, seed or input?)"
        )

    # -- under the run's lineage lock -----------------------------------------------------

    def settled(self, ordinals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The positions of ``ordinals`` (merge outputs), settled now: each one's item and
        branch-run ordinal go to its era."""
        items: dict[Era, list[int]] = {}
        outputs: dict[Era, list[int]] = {}
        first = self.first_out
        for start, end in ordinals:
            for _, era, item, ordinal in self.picks[max(start - first, 0):max(end - first, 0)]:
                items.setdefault(era, []).append(item)
                outputs.setdefault(era, []).append(ordinal)
        for era, got in items.items():
            era.settled.add(runs(got))
            era.outputs.add(runs(outputs[era]))
        return super().settled(ordinals)

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        """The positions (merge outputs) newly settled; the picks below ``mark`` are
        dropped."""
        positions = super().settle(outputs, mark)
        drop = min(len(self.picks), mark - self.first_out)
        if drop > 0:
            del self.picks[:drop]
            self.first_out += drop
            for track in self.tracks:
                track.fold()
        return positions

    def get_state(self) -> dict[str, Any] | None:
        branches = []
        for track in self.tracks:
            done = [list(run) for run in track.done]
            listed = [era for era in track.eras if era.reported]
            eras: list[dict[str, Any]] = []
            for index, era in enumerate(listed):
                if (not eras and index < len(listed) - 1 and era.length is not None
                        and era.settled.mark >= era.length):
                    add_run(done, era.length)  # settled in full, like those folded already
                    continue
                eras.append(_era_state(era))
            branches.append({"done": done, "eras": eras})
        return {"branches": branches}


def _era_state(era: Era) -> dict[str, Any]:
    """An era's saved state (lock held).

    Raises:
        LookupError: A stage of its branch keeps no ledger (it is named).
    """
    if era.lineage is None:  # resumed and not built yet: as it was saved
        assert era.plan is not None
        positions, extras = era.plan.skip, era.plan.nodes
    else:
        positions, extras, _ = era.lineage.snapshot(era.outputs.span())
    state = {"epoch": era.epoch, "positions": positions.to_json(), "nodes": extras,
             "taken": era.settled.to_json()}
    if era.sampler is not None:
        state["sampler"] = era.sampler
    return state
