"""Every hook a feature offers the engine, declared in one place.

The engine asks a source, a node, a stage function or a consumer hook for these methods, and
for nothing else it does not own: each is a protocol here (``runtime_checkable`` where the
engine tests for it), or a marker attribute read by the function named below. A feature
implements the methods under the same names without importing this module (EXTENDING.md,
"Hooks a feature implements").

Stages:

* :class:`Node`, reading a :class:`Receiver` and writing a :class:`Sender`: one stage of one
  run (a ``CustomSpec``'s factory builds it); :class:`ReceiveHook`: what a node adds to run on
  each item in the consumer's thread.
* :class:`Assembler` / :class:`PositionedAssembler`: what ``Pipeline.assemble`` runs (rows in,
  whole batches out; positioned: resumable), implemented by ``image.folder``'s batch slots.
* :class:`SettlingNode`, :class:`TracingNode`, :class:`StatefulNode`: a custom node's
  position for resume (its settled inputs, one output's inputs, JSON extras).
* :class:`Budgeted`: a spec with a failure budget of its own (``max_failures``).
* :func:`runs_inline` (``asyncflow_inline = False`` on a map function: never on the loop) and
  :func:`round_robin` (``asyncflow_round_robin = True``: chunk ``i`` to worker ``i % n``; the
  engine reads it and tells the stage's ``asyncflow.workers.ProcessPool``).

Sources and pipelines:

* :class:`ResumableSource` (a sampler's ``state_dict`` / ``load_state_dict``),
  :class:`ListedSource` (``listing_identity``), :class:`SplitShare` (``split_state``),
  :class:`KeyedIterator` (``seed_key`` on a source's iterator; public as
  ``seeding.KeyedIterator``, where it is defined beside the seeds it keys),
  :data:`SourceGate` (a run plan's ``gate``: its source, or merge, read only once a feature
  on the run's loop allows it).
* The epoch: a source or stage reads its run's from ``current_epoch()`` (the pipeline owns
  the count); :class:`EpochSampler` (``next_epoch`` and ``set_epoch``): a sampler, which
  draws its own epochs as torch's do.

Runs: :data:`ConsumerHook` (what a pipeline's hook factory builds per run; a
:class:`Closable` one is closed when its run ends) and :class:`MergePolicy` /
:class:`MergeChooser` (the order a merge reads its inputs in: ``asyncflow.mix``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

from ..workers import KeyedIterator
from ._span import Span

__all__ = [
    "ROUND_ROBIN",
    "RUNS_INLINE",
    "Assembler",
    "BranchEnd",
    "Budgeted",
    "Closable",
    "ConsumerHook",
    "EpochSampler",
    "KeyedIterator",
    "ListedSource",
    "MergeChooser",
    "MergePolicy",
    "Node",
    "PositionedAssembler",
    "ReceiveHook",
    "Receiver",
    "ResumableSource",
    "Sender",
    "SettlingNode",
    "SourceGate",
    "SplitShare",
    "StatefulNode",
    "TracingNode",
    "round_robin",
    "runs_inline",
]

#: What happens to a branch that ran out: ``"stop"`` ends the merge, ``"drop"`` reads it no
#: more, ``"restart"`` rebuilds it as a new epoch of its input, in the same run.
BranchEnd = Literal["stop", "drop", "restart"]

B_co = TypeVar("B_co", covariant=True)


class Receiver(Protocol):
    """The input side a node reads (a :class:`Channel`)."""

    async def get_many(self, limit: int) -> list[Any]: ...


class Sender(Protocol):
    """The output side a node writes (a :class:`Channel` or the consumer hand-off)."""

    async def put(self, item: Any) -> None: ...

    async def put_many(self, items: list[Any]) -> None: ...

    def __len__(self) -> int: ...


class Node(Protocol):
    """One stage of one run. ``inp`` is ``None`` for the source."""

    async def run(self, inp: Receiver | None, out: Sender) -> None: ...


class ReceiveHook(Protocol):
    """Runs in the consumer's thread on each item before it is yielded."""

    def __call__(self, item: Any) -> Any: ...


class Assembler(Protocol[B_co]):
    """Told of each row as it arrives; returns the batches it completes, in batch order.

    Both methods run on the run's event loop, one row at a time, in arrival order: keep them
    quick (bookkeeping, not copies of whole batches where that can be avoided).
    """

    def failure(self, row: Any) -> Exception | None:
        """The error a failed row carries (it is counted against ``max_failures``), or
        ``None`` for a row that arrived whole."""
        ...

    def arrived(self, row: Any, *, ok: bool) -> Sequence[B_co]:
        """Record ``row`` (``ok``: it arrived whole; else it failed and its batch is released
        without it) and return the batches now complete, in batch order (often none)."""
        ...


@runtime_checkable
class PositionedAssembler(Assembler[B_co], Protocol[B_co]):
    """An assembler whose rows have positions (their place in the epoch's order, which fixes
    their batch): what makes an ``assemble`` stage resumable.
    """

    def position(self, row: Any) -> int:
        """The position of ``row`` (failed or not)."""
        ...

    def release(self, row: Any, *, ok: bool) -> Sequence[tuple[B_co | None, Sequence[int]]]:
        """As :meth:`arrived`, each batch it releases paired with the positions of the rows
        it holds (those that arrived whole); ``None`` for a batch released without output
        (every row failed, or ``drop_last``'s short batch)."""
        ...

    def resume(self, settled: Span) -> None:
        """The next run's rows at ``settled`` positions will not arrive (delivered in an
        earlier run, or failed there): leave them out of their batches."""
        ...


@runtime_checkable
class SettlingNode(Protocol):
    """A custom node that says which of its inputs are settled (EXTENDING.md, "A stage's
    position"): what makes a pipeline through it resumable without ``items_per_output``."""

    def settled_inputs(self, outputs: Span) -> Span:
        """The inputs every output of which is among the settled ``outputs``."""
        ...


@runtime_checkable
class TracingNode(Protocol):
    """A custom node that names the inputs of one output (a journal's trace)."""

    def inputs_of(self, ordinal: int) -> Sequence[int]:
        """The input ordinals output ``ordinal`` was made of."""
        ...


@runtime_checkable
class StatefulNode(Protocol):
    """A custom node with JSON extras in the pipeline's state, under the stage's name."""

    def get_state(self) -> dict[str, Any] | None:
        """The extras to save (``None``: none), read in the consumer's thread."""
        ...

    def set_state(self, state: dict[str, Any]) -> None:
        """Called with the saved extras before a resumed run starts."""
        ...


@runtime_checkable
class Budgeted(Protocol):
    """A stage spec that takes a failure budget of its own (``MapSpec``, ``AssembleSpec``):
    ``None`` is the pipeline's ``max_failures``."""

    @property
    def max_failures(self) -> int | float | None:
        """Failed items the stage may skip (an int, or a fraction of its items)."""
        ...


#: A map function's marker: ``False`` keeps it off the run's loop (it blocks, holds a lock).
RUNS_INLINE = "asyncflow_inline"
#: A map function's marker: ``True`` deals chunk ``i`` to process worker ``i % n`` (a
#: DataLoader's fetch, whose batches must come from torch's worker for them).
ROUND_ROBIN = "asyncflow_round_robin"


def runs_inline(fn: Any) -> bool:
    """Whether ``fn`` may run on the loop when cheap: not when it says ``asyncflow_inline =
    False``."""
    return getattr(fn, RUNS_INLINE, True) is not False


def round_robin(fn: Any) -> bool:
    """Whether ``fn``'s chunks go to process workers in turn (``asyncflow_round_robin =
    True``) rather than to the first free one: chunk ``i`` to worker ``i % n``, as torch's
    loader sends batch ``i`` to worker ``i % num_workers``, so which worker fetches an item
    does not depend on timing."""
    return getattr(fn, ROUND_ROBIN, False) is True


@runtime_checkable
class ResumableSource(Protocol):
    """A source that saves its own position (a sampler): its ``state_dict()`` is saved under
    ``"sampler"`` and given back to ``load_state_dict`` on resume."""

    def state_dict(self) -> dict[str, Any]:
        """The source's position, plain JSON."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back to a saved position."""
        ...


@runtime_checkable
class ListedSource(Protocol):
    """A source that says what it lists (``asyncflow.pipeline.listing_identity``), so a
    resume state over another listing is refused, naming where the two differ."""

    def listing_identity(self) -> dict[str, Any]:
        """``listing_identity(names, contents)`` of every item the source lists."""
        ...


@runtime_checkable
class SplitShare(Protocol):
    """A share of a list cut between ranks (``asyncflow.Split``): its part is saved under
    ``"split"``, for an elastic resume under another world size."""

    def split_state(self) -> dict[str, Any]:
        """The share's part, plain JSON."""
        ...


#: A run plan's ``gate`` (``RunPlan.gate``), awaited on the run's loop before the run reads
#: its source or starts its merge's branches: ``False`` ends the source at once, never opened.
#: A feature that decides on the run's loop whether to read the source at all (a cache fill,
#: which may replay after all) holds it there; its wait is cancelled with the run (the
#: source is then not opened).
SourceGate: TypeAlias = Callable[[], Awaitable[bool]]


@runtime_checkable
class EpochSampler(Protocol):
    """A sampler that says which epoch it draws next (``asyncflow.sources.Sampler``): a
    merge records it per era and sets it back on resume."""

    def set_epoch(self, epoch: int) -> None:
        """The next iteration draws ``epoch``."""
        ...

    @property
    def next_epoch(self) -> int:
        """The epoch its next iteration draws."""
        ...


@runtime_checkable
class Closable(Protocol):
    """A consumer hook with resources: ``close()`` is called once when its run ends."""

    def close(self) -> None:
        """Release what the hook holds."""
        ...


#: What a pipeline's hook factory (``with_hook``) builds per run: a :class:`ReceiveHook`, called
#: on every item in the consumer's thread; a :class:`Closable` one is closed when its run ends.
ConsumerHook: TypeAlias = ReceiveHook


class MergeChooser(Protocol):
    """The choices of one run of a merge (made by :meth:`MergePolicy.open`); called on the
    run's loop, one call at a time."""

    def choose(self) -> int | None:
        """The branch (an index into the inputs) to take the next item from, or ``None`` to
        end the merge."""
        ...

    def ended(self, branch: int, *, empty: bool) -> BranchEnd:
        """Branch ``branch`` ran out; ``empty``: it yielded nothing since it (re)started.

        Drop an empty branch rather than restart it: an empty input would restart forever.
        """
        ...


@runtime_checkable
class MergePolicy(Protocol):
    """Chooses, run by run, which branch each item of a merge comes from."""

    def open(self, epoch: int, branches: int) -> MergeChooser:
        """The chooser of the merge's run number ``epoch`` over ``branches`` inputs."""
        ...
