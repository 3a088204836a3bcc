"""A merge's lineage: which branch items lie behind the merge's settled outputs, and how a
resumed merge replays its policy's choices.

The merge's outputs play the part of a source's positions (its ledger is a
:class:`~asyncflow.pipeline._lineage.SourceLedger`: a resumed run's outputs leave the settled
ones out). Each output is also recorded as item ``k`` of an *era* of branch ``b`` (an epoch of
its input within the merge run: a restart begins the next, ``_merge_epochs.py``) and as that
era's branch-run output ordinal, until it is settled. The state holds, per branch, the lengths
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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import ConfigError
from ._ledger import SourceLedger, SourcePlan
from ._merge_epochs import Era, Track, add_run, branch_at, count_on, tracks_of
from ._span import runs

__all__ = ["END", "PASS", "TAKE", "MergeLedger", "branch_at", "tracks_of"]

#: What a choice of a branch is to a merge (:meth:`MergeLedger.pick`): take the branch's next
#: item; pass over an item settled before a resume (of an era listed, or settled in full);
#: the end of an era settled in full (tell the policy the branch ran out).
TAKE, PASS, END = range(3)


class MergeLedger(SourceLedger):
    """The merge node's ledger (its outputs are the run's positions), and per output in
    flight its branch's era, the era's item number and the branch run's output ordinal.

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
        self.picks: list[tuple[Era, int, int]] = []  # (era, item, ordinal) of each output from
        self.first_out = 0  # this output ordinal on
        self._on = False  # until the run's lineage says whether it keeps records

    @property
    def on(self) -> bool:
        """Whether records are kept: set by the run's lineage (``Lineage.attach``), turned
        off when the run stops. Turned off, it turns the records of its eras' branches off
        too (a run that keeps none: a stage after the merge keeps no ledger; a merge within
        a merge). A branch built later keeps records if the run's lineage does (its
        ``missing`` is ``None``)."""
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        if not value:
            for track in self.tracks:
                for era in track.eras:
                    if era.lineage is not None:
                        era.lineage.freeze()
        self._on = value

    # -- on the run's loop ----------------------------------------------------------------

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
        ctx.lineage.follow(lambda: era.outputs.mark)  # the era's outputs settled, all below

    def pick(self, branch: int) -> int:
        """What a choice of ``branch`` is: :data:`TAKE`, :data:`PASS` or :data:`END` (a pass
        is counted here)."""
        track = self.tracks[branch]
        if track.replay:
            if track.passed < track.replay[0][0]:
                track.passed += 1
                return PASS
            return END
        era = track.era
        item, skip = era.next, era.skip
        if item < skip.mark or (skip.ranges and item in skip):
            era.next = item + 1
            return PASS
        return TAKE

    def take(self, branch: int) -> None:
        """The merge took ``branch``'s next item, to put it out (recorded before it is)."""
        era = self.tracks[branch].era
        item, ordinal = era.next, era.ran
        era.next, era.ran = item + 1, ordinal + 1
        self.emitted += 1
        if self._on:
            with self.lock:
                self.picks.append((era, item, ordinal))
            self.grew(1)

    def ran_out(self, branch: int) -> bool:
        """The era ``branch`` reads has run out (or, replayed, an era settled in full: at
        :data:`END`): its length is known. Returns whether it was empty (no item taken or
        passed over since the branch (re)started)."""
        track = self.tracks[branch]
        if track.replay:
            return track.replay[0][0] == 0
        era = track.era
        with self.lock:
            era.length = era.next
        return era.length == 0

    def ended(self, branch: int, verdict: str) -> None:
        """The policy's verdict on ``branch``, which ran out: a restart begins its next era.

        Raises:
            ConfigError: A resumed run's policy ended a branch that its state says restarted
                (at an era settled in full, or one listed before the last).
        """
        track = self.tracks[branch]
        with self.lock:
            if verdict == "restart":
                track.advance()
                return
            pending = track.replay or track.eras[-1] is not track.era  # eras after it
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
            for era, item, ordinal in self.picks[max(start - first, 0):max(end - first, 0)]:
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
             "taken": era.settled.span().to_json()}
    if era.sampler is not None:
        state["sampler"] = era.sampler
    return state
