"""A merge's lineage: which branch items lie behind the merge's settled outputs, and how a
resumed merge replays its policy's choices.

The merge's outputs play the part of a source's positions (its ledger is a
:class:`~asyncflow.pipeline._lineage.SourceLedger`: a resumed run's outputs leave the settled
ones out). Each output is also recorded as *branch* ``b``'s item ``k`` (``k`` counts that
branch's items in the uninterrupted run's numbering) and as that branch run's output ordinal,
until it is settled. The state holds, per branch, the items settled (``taken``: a watermark
plus ranges) and the branch's own lineage state (its settled source positions and stage
extras, from the branch's ledgers), and its epoch.

Resuming, the merge asks its policy for the same choices again (they are reproducible: a
policy depends on its seed and the epoch), from the first: a choice of branch ``b`` whose next
item ``k`` was settled is passed over, any other takes the branch's next item, and each branch
resumes with its settled items left out. So the merge yields exactly the items not yet
delivered, in the uninterrupted run's order (where the branches keep order). Replaying costs
one choice per item already delivered, at the resumed run's start (about 1.5 us each).

A branch restarted within a run (``mix(stop="cycle" | "never")``) is a new epoch of its
input, numbered anew: a state taken after one has restarted raises ``ConfigError``.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from ._lineage import Lineage, SourceLedger, SourcePlan
from ._span import Span

__all__ = ["BranchResume", "MergeLedger", "branch_resumes"]


class BranchResume:
    """Where one branch of a resumed merge starts: its epoch, its source plan, and the items
    of it that the merge passes over (settled before)."""

    def __init__(self, epoch: int, plan: SourcePlan, taken: Span) -> None:
        self.epoch = epoch
        self.plan = plan
        self.taken = taken


def branch_resumes(state: Any, branches: int, name: str) -> list[BranchResume] | None:
    """The branches' resumes from a merge's saved extras (``None``: not resuming).

    Raises:
        ConfigError: The extras are not what :meth:`MergeLedger.get_state` saved for
            ``branches`` branches.
    """
    if state is None:
        return None
    saved = state.get("branches") if isinstance(state, dict) else None
    if not isinstance(saved, list) or len(saved) != branches:
        raise ConfigError(f"the state of merge {name!r}: expected {branches} branches")
    out = []
    for index, entry in enumerate(saved):
        what = f"merge {name!r}, branch {index}"
        if not isinstance(entry, dict) or not {"epoch", "positions", "nodes", "taken"} <= set(
            entry
        ):
            raise ConfigError(f"{what}: expected epoch, positions, nodes and taken")
        epoch, nodes = entry["epoch"], entry["nodes"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"{what}: the epoch must be an int >= 0, got {epoch!r}")
        if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
            raise ConfigError(f"{what}: nodes must map stage names to dicts")
        positions = Span.from_json(entry["positions"], f"{what}'s positions")
        taken = Span.from_json(entry["taken"], f"{what}'s items taken")
        out.append(BranchResume(epoch, SourcePlan(skip=positions, nodes=nodes), taken))
    return out


class MergeLedger(SourceLedger):
    """The merge node's ledger (its outputs are the run's positions), and per output in
    flight its branch, the branch's item number and the branch run's output ordinal.

    Args:
        plan: The run's source plan (a resumed run: the merge outputs settled before).
        branches: How many inputs the merge has.
        resumes: Each branch's resume, or ``None`` (a new epoch).
    """

    def __init__(self, plan: SourcePlan, branches: int,
                 resumes: list[BranchResume] | None = None) -> None:
        super().__init__(plan)
        self.epochs = [0] * branches
        self.lineages: list[Lineage | None] = [None] * branches  # set as branches are built
        self.skip = [r.taken for r in resumes] if resumes else [Span()] * branches
        self.next = [0] * branches  # each branch's next item number (uninterrupted numbering)
        self.ran = [0] * branches  # each branch run's outputs taken
        self.picks: list[tuple[int, int, int]] = []  # (branch, item, branch ordinal) from
        self.first_out = 0  # this output ordinal on
        self.settled = list(self.skip)  # per branch: items settled, compacted
        self.floor = [0] * branches  # per branch: its run's outputs settled, compacted
        #: The branch that restarted first, if any: the state cannot be taken.
        self.restarted: int | None = None

    def passes(self, branch: int) -> bool:
        """Whether the merge passes over this choice of ``branch`` (its next item was
        settled before a resume); counts it if so."""
        item = self.next[branch]
        if item < self.skip[branch].mark or (self.skip[branch].ranges and
                                             item in self.skip[branch]):
            self.next[branch] = item + 1
            return True
        return False

    def take(self, branch: int) -> None:
        """The merge took ``branch``'s next item, to put it out (recorded before it is)."""
        item, ordinal = self.next[branch], self.ran[branch]
        self.next[branch], self.ran[branch] = item + 1, ordinal + 1
        self.emitted += 1
        if self.on:
            with self.lock:
                self.picks.append((branch, item, ordinal))
            self.grew(1)

    def floor_of(self, branch: int) -> int:
        """The outputs of ``branch``'s run settled and compacted here: its lineage's floor."""
        return self.floor[branch]

    def restart(self, branch: int) -> None:
        """Branch ``branch`` restarts as a new epoch: its numbering begins again."""
        if self.restarted is None:
            self.restarted = branch
        self.ran[branch] = 0

    def _per_branch(self, outputs: Span) -> tuple[list[list[int]], list[list[int]]]:
        """Per branch, the items and branch ordinals of the settled outputs still listed."""
        items: list[list[int]] = [[] for _ in self.next]
        ordinals: list[list[int]] = [[] for _ in self.next]
        first, end = self.first_out, self.first_out + len(self.picks)
        for low, high in outputs.intervals():
            for branch, item, ordinal in self.picks[max(low, first) - first:
                                                    min(high, end) - first]:
                items[branch].append(item)
                ordinals[branch].append(ordinal)
        return items, ordinals

    def compact(self, outputs: Span, inputs: Span) -> None:
        drop = min(len(self.picks), outputs.mark - self.first_out)
        if drop <= 0:
            return
        items: list[list[int]] = [[] for _ in self.next]
        for branch, item, ordinal in self.picks[:drop]:
            items[branch].append(item)
            self.floor[branch] = ordinal + 1  # a branch's outputs are taken in order
        for branch, settled in enumerate(items):
            if settled:
                done = self.settled[branch]
                self.settled[branch] = Span.of(done.mark, settled, done.ranges)
        del self.picks[:drop]
        self.first_out += drop

    def get_state(self, outputs: Span, key_of: Any) -> dict[str, Any] | None:
        if self.restarted is not None:
            raise ConfigError(
                f"this pipeline cannot be resumed: branch {self.restarted} of its merge "
                "restarted as a new epoch in this run (mix(stop='cycle' or 'never')); take "
                "the state before any input runs out, or use stop='first' or 'all'"
            )
        items, ordinals = self._per_branch(outputs)
        branches = []
        for branch, lineage in enumerate(self.lineages):
            if lineage is None or lineage.missing is not None:
                raise LookupError(lineage.missing if lineage is not None else f"{branch}")
            done = self.settled[branch]
            positions, extras = lineage.snapshot_of(Span.of(self.floor[branch],
                                                            ordinals[branch]))
            branches.append({
                "epoch": self.epochs[branch],
                "positions": positions.to_json(),
                "nodes": extras,
                "taken": Span.of(done.mark, items[branch], done.ranges).to_json(),
            })
        return {"branches": branches}
