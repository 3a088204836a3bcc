"""One run's lineage: which source positions lie behind what the consumer has received.

Each node has a ledger (``_ledger.py``) translating its settled outputs into its settled
inputs. Composed from the consumer's delivered count back to the source, they give the
settled source positions: a :class:`Span` (a watermark plus the ranges settled above it),
which a resumed run skips. The source's ledger (re-exported here) turns source ordinals into
positions.

Nodes write their records on the run's loop; :meth:`Lineage.snapshot` reads them in
the consumer's thread. Both hold :attr:`Lineage.lock` (an ``RLock``), briefly. The lineage
keeps each ledger's settled inputs (:class:`GrowingSpan`), so that a walk (a snapshot, or one
every few hundred records as the consumer advances) gives each ledger only what settled since
the last one, and the ledgers drop the records behind it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._ledger import FixedLedger, Ledger, SourceLedger, SourcePlan, received
from ._protocols import SettlingNode, StatefulNode, TracingNode
from ._span import GrowingSpan, Span, runs

__all__ = ["Lineage", "SourceLedger", "SourcePlan", "node_ledger", "received"]

#: Records written between walks (amortizes their cost to O(1) a record).
_COMPACT_EVERY = 512


def node_ledger(node: Any, per: int | None) -> Ledger | None:
    """The ledger of a built node: its own ``ledger`` (the engine's nodes), an adapter for a
    custom node that implements ``settled_inputs`` itself (:class:`SettlingNode`), one from
    its spec's ``items_per_output`` (``per``), or ``None``."""
    ledger = getattr(node, "ledger", None)
    if isinstance(ledger, Ledger):
        return ledger
    if isinstance(node, SettlingNode):
        return _NodeAdapter(node)
    if isinstance(per, int) and per >= 1:
        return FixedLedger(per, counted=False)
    return None


class _NodeAdapter(Ledger):
    """A custom node's own ``settled_inputs`` / ``inputs_of`` / ``get_state`` / ``set_state``.

    The node answers for every settled output at once: the adapter keeps them, and gives
    the lineage the node's whole answer each time (the lineage keeps only what is new)."""

    def __init__(self, node: SettlingNode) -> None:
        super().__init__()
        self.node = node
        self.outputs = GrowingSpan()

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        self.outputs.add(outputs)
        return self.node.settled_inputs(self.outputs.span()).intervals()

    def lowest(self, ordinal: int) -> int:
        return self.node.settled_inputs(Span(ordinal)).mark

    def inputs_of(self, ordinal: int) -> list[int]:
        node = self.node
        return list(node.inputs_of(ordinal)) if isinstance(node, TracingNode) else []

    def get_state(self) -> dict[str, Any] | None:
        return self.node.get_state() if isinstance(self.node, StatefulNode) else None

    def set_state(self, state: dict[str, Any]) -> None:
        if isinstance(self.node, StatefulNode):
            self.node.set_state(state)


class Lineage:
    """The ledgers of one run, composed: the settled source positions at any time.

    Args:
        plan: Where the run's source starts.
    """

    def __init__(self, plan: SourcePlan | None = None) -> None:
        self.lock = threading.RLock()
        self.source = SourceLedger(plan or SourcePlan())
        self.ledgers: list[Ledger] = [self.source]
        self.names: list[str] = ["source"]
        #: The first stage that keeps no ledger (the run cannot be resumed), or ``None``.
        self.missing: str | None = None
        self._floor: Callable[[], int] | None = None
        self._grown = 0
        self._held: int | None = None  # outputs from it on are kept for trace()
        # The last stage's settled outputs, then each ledger's settled inputs (index for
        # index): a walk gives each ledger what is new in the set after it.
        self._outputs = GrowingSpan()
        self._inputs = [GrowingSpan()]

    def attach(
        self, names: Sequence[str], nodes: Sequence[Any], specs: Sequence[Any], *,
        keep: bool = True, nested: bool = False,
    ) -> None:
        """Take the ledgers of a built run's nodes (the source first; ``specs``: those of the
        stages after it), and restore their saved extras. A merge as the source brings its
        own source ledger (``_merge_resume.py``), unless ``nested`` (a merge's branch). If a
        node has none, or ``keep`` is false (nothing reads the state), every ledger is turned
        off: the run keeps no records."""
        ledgers: list[Ledger] = [self.source]
        kept = ["source"]
        first = getattr(nodes[0], "ledger", None)
        if isinstance(first, SourceLedger) and first is not self.source and not nested:
            self.source = first  # a merge: its outputs are the positions
            ledgers, kept = [first], [names[0]]
        elif first is not self.source or not keep:
            self.missing = names[0]
        for name, node, spec in zip(names[1:], nodes[1:], specs, strict=True):
            ledger = node_ledger(node, spec.items_per_output)
            if ledger is None:
                self.missing = self.missing or name
                continue
            ledgers.append(ledger)
            kept.append(name)
        for index, ledger in enumerate(ledgers):
            ledger.lock, ledger.grew = self.lock, self._grew
            ledger.on = self.missing is None
            if index:
                ledger.join(ledgers[index - 1], functools.partial(self.key_of, index - 1))
        self.ledgers, self.names = ledgers, kept
        self._outputs, self._inputs = GrowingSpan(), [GrowingSpan() for _ in ledgers]
        if self.missing is None:
            for name, ledger in zip(kept, ledgers, strict=True):
                if name in self.source.plan.nodes:
                    ledger.set_state(self.source.plan.nodes[name])

    def freeze(self) -> None:
        """The run is stopping (a stop asked for, a stage failed): keep every record as it
        is. What the stages do while they are torn down (a cancelled expansion ending, a last
        batch dropped) settles nothing, so a state taken afterwards is that at the
        consumer's last item. Thread-safe: writers check :attr:`Ledger.on` with the lock."""
        with self.lock:
            for ledger in self.ledgers:
                ledger.on = False  # a merge's freezes its branches' lineages too

    def follow(self, floor: Callable[[], int]) -> None:
        """Compact as the consumer advances: ``floor()`` is a count it has surely received
        (read on the run's loop)."""
        self._floor = floor

    def _grew(self, records: int) -> None:
        self._grown += records
        if self._grown >= _COMPACT_EVERY and self._floor is not None:
            self._grown = 0
            self.compact(self._floor())

    @property
    def resumed(self) -> SourcePlan:
        """Where this run's source started: the positions a resumed run leaves out."""
        return self.source.plan

    def hold(self, ordinal: int) -> None:
        """Keep the records of outputs ``ordinal`` and later until the next call, whatever
        the consumer has received: a journal (``asyncflow/_journal.py``) calls it with the
        next output it will :meth:`trace`, so that the walks never drop those."""
        with self.lock:
            self._held = ordinal

    def trace(self, ordinal: int) -> list[int] | None:
        """The source positions behind the run's output ``ordinal``, in the order its
        stages took them (an item of a batch in its row's order); ``None`` when a stage keeps
        no ledger (:attr:`missing`). Only outputs :meth:`hold` keeps are surely still traced.
        """
        return None if self.missing is not None else self._behind(len(self.ledgers), ordinal)

    def _behind(self, count: int, ordinal: int) -> list[int]:
        """The source positions behind output ``ordinal`` of ledger ``count - 1``, in the
        order its stages took them."""
        with self.lock:
            ordinals = [ordinal]
            for ledger in reversed(self.ledgers[:count]):
                ordinals = (ledger.inputs_of(ordinals[0]) if len(ordinals) == 1 else
                            [i for o in ordinals for i in ledger.inputs_of(o)])
        return ordinals

    def compact(self, delivered: int) -> None:
        """Settle what ``delivered`` items received settle, and drop the records behind it."""
        if self.missing is not None or delivered <= 0:
            return
        with self.lock:
            self._settle(Span(delivered))

    def key_of(self, index: int, ordinal: int) -> tuple[tuple[int, int], ...]:
        """The source positions behind output ``ordinal`` of ledger ``index``, as sorted
        ``(start, end)`` ranges (how a partial expansion is named)."""
        return tuple(runs(list(self._behind(index + 1, ordinal))))  # a copy: runs() sorts

    def snapshot(
        self, outputs: Span
    ) -> tuple[Span, dict[str, dict[str, Any]], dict[str, str]]:
        """The settled source positions, given the last stage's settled outputs (the
        consumer's count; a merge's branch: those of its items that the merge's consumer has
        settled); each node's extras by stage name, and the canonical JSON text of those
        extras that its ledger keeps at hand (``Ledger.state_text``), by stage name. Compacts
        on the way.

        Raises:
            LookupError: A stage keeps no ledger (:attr:`missing` names it).
        """
        if self.missing is not None:
            raise LookupError(self.missing)
        with self.lock:
            self._settle(outputs)
            extras, texts = {}, {}
            for name, ledger in zip(self.names, self.ledgers, strict=True):
                state = ledger.get_state()
                if state is not None:
                    extras[name] = state
                    if ledger.state_text is not None:
                        texts[name] = ledger.state_text
            return self._inputs[0].span(), extras, texts

    def _settle(self, outputs: Span) -> None:
        """Settle ``outputs`` of the last stage (lock held): each ledger is given only what
        settled since the last walk, and drops the records behind it (but those a trace
        may need: :meth:`hold`)."""
        above = self._outputs
        fresh = above.add(outputs.intervals())
        held = self._held
        keep = above.mark if held is None else min(above.mark, held)
        for ledger, inputs in zip(reversed(self.ledgers), reversed(self._inputs), strict=True):
            fresh = inputs.add(ledger.settle(fresh, keep))
            keep = inputs.mark if held is None else min(inputs.mark, ledger.lowest(keep))
