"""Frozen stage specs: what each stage does and with what settings, validated when given."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import ConfigError, check_budget, check_flags, check_int
from ._protocols import Budgeted
from ._span import Span, is_count
from ._traits import StageTraits, Worker

if TYPE_CHECKING:
    from ..workers import Processes

__all__ = [
    "BatchSpec", "FlatMapSpec", "MapSpec", "PrefetchSpec", "ShuffleSpec",
    "StageSpec", "UnbatchSpec", "check_partial", "fn_name", "stage_names", "unique_names",
]


def fn_name(fn: Any) -> str:
    """A readable name for a stage function."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None) or getattr(fn, "__qualname__", None)
    return str(name) if name else type(fn).__name__


def _check_callable(kind: str, fn: Any) -> None:
    if not callable(fn):
        raise ConfigError(f"{kind}() needs a callable, got {type(fn).__name__}: {fn!r:.80}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: checked by the first call
        return
    try:
        sig.bind(object())
    except TypeError as exc:
        raise ConfigError(
            f"{kind}({fn_name(fn)}): the function must accept one positional argument "
            f"(the item), but its signature is {fn_name(fn)}{sig}: {exc}"
        ) from None


def stage_names(specs: Sequence[StageSpec]) -> list[str]:
    """The unique names of a pipeline's stages, the source's (``"source"``) first.

    Each is the stage's ``name=`` or its default name; a name already taken gets ``#2``,
    ``#3``, ...: two unnamed ``map`` stages are ``map`` and ``map#2``. ``stats()``,
    ``describe()`` and error notes all name stages so.
    """
    return unique_names(["source", *(spec.name or spec.default_name() for spec in specs)])


def unique_names(bases: Sequence[str]) -> list[str]:
    """``bases`` in order, each name already taken by an earlier one followed by ``#2``,
    ``#3``, ...: ``["map", "map"]`` gives ``["map", "map#2"]``."""
    names: list[str] = []
    taken: set[str] = set()
    for base in bases:
        name, n = base, 2
        while name in taken:
            name, n = f"{base}#{n}", n + 1
        taken.add(name)
        names.append(name)
    return names


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """Base of every stage spec (``name``: the stage's label in stats and error notes). A
    stage is a spec, which declares its traits (``_traits.py``), and the node registered for
    its class (``_node.node_for``)."""

    kind: ClassVar[str] = "stage"
    #: What the stage is (a spec whose traits follow its fields overrides :attr:`traits`).
    TRAITS: ClassVar[StageTraits] = StageTraits()
    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError(f"name must be a non-empty string, got {self.name!r}")
        # the settings every spec has, checked once here for those that declare them
        check_int("concurrency", self.concurrency)
        check_int("buffer", self.buffer, allow_none=True)
        check_int("buffer_bytes", self.buffer_bytes, allow_none=True)
        if isinstance(self, Budgeted):
            check_budget("max_failures", self.max_failures, allow_none=True)

    def default_name(self) -> str:
        return self.kind

    def settings(self) -> dict[str, Any]:
        """JSON-able settings, for reprs and for fingerprints of the pipeline."""
        return {}

    def check_state(self, extras: dict[str, Any], what: str) -> None:
        """Check the extras a loaded state holds for this stage (what its node saved), so
        that a forged or damaged state fails on load, naming the field, not mid-run. The
        default takes any dict: the node's ``set_state`` reads what it saved.

        Raises:
            ConfigError: They are not what this stage saves (``what`` names them).
        """
        return None

    @property
    def traits(self) -> StageTraits:
        """What the stage is: ordered, per item, how it groups items ... (``_traits.py``)."""
        return self.TRAITS

    # The settings the builder, the lineage and the pipeline read of any spec (a subclass
    # declares a field of the same name to set one; ``__post_init__`` checks them). A failure
    # budget of its own is the protocol ``_protocols.Budgeted``
    # (``dataclasses.replace(spec, max_failures=...)``).

    @property
    def concurrency(self) -> int:
        """Calls of the stage at once (its threads reserved, with ``traits.worker`` threads)."""
        return 1

    @property
    def buffer(self) -> int | None:
        """The output queue's capacity (``None``: the default for the stage)."""
        return None

    @property
    def buffer_bytes(self) -> int | None:
        """The output queue's byte budget (``None``: the pipeline's)."""
        return None

    @property
    def executor(self) -> Executor | None:
        """Where its sync calls run (``None``: the run's worker threads)."""
        return None

    @property
    def items_per_output(self) -> int | None:
        """Inputs behind each output when fixed, in order (output ``k`` is made of inputs
        ``[k * n, (k + 1) * n)``; ``1``: in step with its input, which keeps the stages after
        it in step with the source): what makes a stage resumable without a ledger of its
        own. ``None`` when unknown."""
        return None

    @property
    def terminal(self) -> bool:
        """Whether the stage must be the last one (a device transfer)."""
        return False

    @property
    def note(self) -> str | None:
        """Why the stage runs where it runs, when that was chosen for the user."""
        return None


@dataclass(frozen=True, kw_only=True)
class MapSpec(StageSpec):
    """Apply ``fn`` to each item (``map``), keep items it accepts (``filter``) or emit the items
    of the iterable it returns (``flat_map``), ``concurrency`` items at a time."""

    mode: str = "map"
    fn: Callable[[Any], Any]
    concurrency: int = 1
    ordered: bool = True
    executor: Executor | None = None
    max_failures: int | float | None = None
    buffer: int | None = None
    buffer_bytes: int | None = None
    #: Worker processes instead of threads (``None``: threads).
    processes: Processes | None = None
    #: Why the stage runs where it runs, when that was chosen for the user (``stats().notes``).
    note: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in (("flat_map",) if isinstance(self, FlatMapSpec) else ("map", "filter")):
            raise ConfigError(f"unknown mode {self.mode!r}")
        _check_callable(self.mode, self.fn)
        check_flags(self, "ordered")
        if self.executor is not None and not isinstance(self.executor, Executor):
            raise ConfigError(
                f"executor must be a concurrent.futures.Executor, got {self.executor!r}"
            )
        if self.executor is None and self.processes is None:
            return
        # an executor, or worker processes: not for an async function, and not both
        what = f"{self.mode}({fn_name(self.fn)})"
        if self.is_async:
            raise ConfigError(f"{what}: an async function runs on the event loop, not in an "
                              "executor or worker processes")
        if self.processes is not None:
            if self.executor is not None:
                raise ConfigError(f"{what}: give executor= or workers='processes', not both")
            if self.mode == "flat_map":
                raise ConfigError(f"{what}: flat_map runs on threads; map to a list in worker "
                                  "processes, then unbatch()")
            from ..workers import check_picklable

            check_picklable(self.fn, self.processes, self.name or self.default_name())

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.mode

    @property
    def traits(self) -> StageTraits:
        splits = self.mode == "flat_map"  # its ledger saves partial expansions
        return StageTraits(ordered=self.ordered, per_item=True, worker=self._worker(), tunable=True,
                           grouping="elements" if splits else None, stateful=splits,
                           keeps_items=self.mode == "filter")

    def _worker(self) -> Worker:
        """What its calls run on (``traits.worker``; :meth:`settings` reads it on every
        ``state_dict()``, without building the traits)."""
        return ("loop" if self.is_async else "executor" if self.executor is not None
                else "processes" if self.processes is not None else "threads")

    @property
    def items_per_output(self) -> int | None:
        return 1 if self.mode == "map" and self.ordered else None

    @property
    def is_async(self) -> bool:
        """Whether ``fn`` runs on the loop: a coroutine or async generator function, a partial
        of one, or an object whose ``__call__`` is one."""
        fn = self.fn
        while isinstance(fn, functools.partial):
            fn = fn.func
        return any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
                   for f in (fn, getattr(fn, "__call__", None)))  # noqa: B004

    def default_name(self) -> str:
        name = fn_name(self.fn)
        return self.mode if name == "<lambda>" else name

    def settings(self) -> dict[str, Any]:
        runs_on = type(self.executor).__name__ if self.executor else self._worker()
        return {"fn": fn_name(self.fn), "concurrency": self.concurrency, "ordered": self.ordered,
                "runs_on": runs_on, "max_failures": self.max_failures, "buffer": self.buffer,
                "buffer_bytes": self.buffer_bytes}


@dataclass(frozen=True, kw_only=True)
class FlatMapSpec(MapSpec):
    """``flat_map``: emit the items of the (async) iterable ``fn`` returns for each item."""

    mode: str = "flat_map"

    def check_state(self, extras: dict[str, Any], what: str) -> None:
        check_partial(extras, what)  # its ledger's partial expansions (``_expansion.py``)


@dataclass(frozen=True, kw_only=True)
class BatchSpec(StageSpec):
    """Group items into lists of ``size``."""

    kind: ClassVar[str] = "batch"
    TRAITS: ClassVar[StageTraits] = StageTraits(ordered=True, per_item=True, grouping="lists",
                                                worker="loop")
    size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("batch size", self.size)
        check_flags(self, "drop_last")

    @property
    def items_per_output(self) -> int | None:
        return self.size

    def settings(self) -> dict[str, Any]:
        return {"size": self.size, "drop_last": self.drop_last}


@dataclass(frozen=True, kw_only=True)
class UnbatchSpec(StageSpec):
    """Emit the elements of each (iterable) item."""

    kind: ClassVar[str] = "unbatch"
    TRAITS: ClassVar[StageTraits] = StageTraits(
        ordered=True, per_item=True, grouping="elements", stateful=True, worker="loop"
    )

    def check_state(self, extras: dict[str, Any], what: str) -> None:
        check_partial(extras, what)  # its ledger's partial expansions (``_expansion.py``)


@dataclass(frozen=True, kw_only=True)
class PrefetchSpec(StageSpec):
    """A bounded buffer of ``size`` items that keeps filling while the consumer is busy."""

    kind: ClassVar[str] = "prefetch"
    TRAITS: ClassVar[StageTraits] = StageTraits(
        ordered=True, per_item=True, keeps_items=True, worker="loop"
    )
    size: int

    def __post_init__(self) -> None:
        check_int("prefetch size", self.size)  # before super() checks it as the buffer
        super().__post_init__()

    @property
    def buffer(self) -> int | None:
        return self.size

    @property
    def items_per_output(self) -> int | None:
        return 1

    def settings(self) -> dict[str, Any]:
        return {"size": self.size}


@dataclass(frozen=True, kw_only=True)
class ShuffleSpec(StageSpec):
    """Shuffle through a buffer of ``buffer_size`` items, seeded per epoch."""

    kind: ClassVar[str] = "shuffle"
    TRAITS: ClassVar[StageTraits] = StageTraits(keeps_items=True, worker="loop")
    buffer_size: int
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("buffer_size", self.buffer_size)

    def settings(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size, "seed": self.seed}


def check_partial(extras: dict[str, Any], what: str) -> None:
    """Check a saved state's extras of a ``flat_map`` / ``unbatch`` stage, what
    ``_expansion.SplitLedger.get_state`` gives: ``{"partial": [{"input": [[a, b], ...], "done":
    span}, ...]}``.

    Raises:
        ConfigError: They are not (``what`` and the field are named).
    """
    if set(extras) - {"partial"}:
        raise ConfigError(f"{what} has unknown fields {sorted(set(extras) - {'partial'})}")
    partial = extras.get("partial", [])
    if not isinstance(partial, list):
        raise ConfigError(f"{what}['partial'] must be a list, got {type(partial).__name__}")
    for index, entry in enumerate(partial):
        where = f"{what}['partial'][{index}]"
        if not isinstance(entry, dict) or set(entry) != {"input", "done"}:
            raise ConfigError(f"{where} must be a dict of input and done")
        pairs = entry["input"]
        if not isinstance(pairs, list) or not pairs or not all(
                isinstance(p, list) and len(p) == 2 and is_count(p[0]) and is_count(p[1])
                and p[0] <= p[1] for p in pairs):
            raise ConfigError(f"{where}['input'] must be a list of [start, stop] source "
                              f"positions, got {pairs!r:.80}")
        Span.from_json(entry["done"], f"{where}['done']")
