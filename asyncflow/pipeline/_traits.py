"""What a stage is, as everything outside its node needs to know it: ``StageTraits``.

Every stage spec declares its traits (``spec.traits``); the graph builder, the resume
ledgers, the journal, the cache, ``image.folder`` and the profiler read them, never a list of
stage kinds. A built-in spec declares them in ``_spec.py``; a third party's stage declares them
on its spec class (``TRAITS``) or, for a :class:`~asyncflow.pipeline.CustomSpec`, in its
``traits`` field (EXTENDING.md, "A stage of a new kind").

Two more facts about a stage are spec fields, because a ``CustomSpec`` sets them per
instance: ``items_per_output`` (the fixed number of inputs behind each output, in order:
``1`` for a stage in step with its input) and ``terminal`` (nothing may follow it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._errors import ConfigError, check_flags

__all__ = ["Grouping", "StageTraits", "Worker"]

#: How a stage regroups items (``None``: item for item, or dropping some).
Grouping = Literal["lists", "batches", "elements"] | None
#: What a stage's calls run on.
Worker = Literal["loop", "threads", "processes", "executor"]

_GROUPINGS = (None, "lists", "batches", "elements")
_WORKERS = ("loop", "threads", "processes", "executor")


@dataclass(frozen=True, kw_only=True)
class StageTraits:
    """What a stage is, for the code around its node. The defaults describe a stage nothing
    is known about: safe to build and run, never assumed replayable, resumable or tunable.

    Attributes:
        ordered: Its outputs leave in the order of the inputs they are made from (an
            unordered map, a shuffle and an assembler's batches do not).
        per_item: Each output depends only on the inputs it is made from: not on other
            items, their timing or a seed drawn per epoch. With ``ordered``, a journal can
            make an output again from its recorded inputs alone.
        grouping: How it regroups items: ``"lists"`` (each output a list of inputs:
            ``batch``), ``"batches"`` (collated batches: ``assemble``), ``"elements"`` (each
            input split into its elements: ``unbatch``, ``flat_map``), or ``None`` (item for
            item, maybe dropping some). The cache reads it to know what a pipeline yields.
        keeps_items: Its outputs are its input items themselves, unchanged (it may drop,
            hold back or reorder them: ``filter``, ``prefetch``, ``shuffle``); a list of
            samples stays one through it.
        stateful: It keeps state of its own that a resumed run must get back (saved with
            ``state_dict()`` under the stage's name). A custom stage that declares it has a
            node implementing ``settled_inputs``, ``get_state`` and ``set_state``; one that
            does not declare it has a node without ``get_state`` (the run refuses to build
            otherwise, naming the stage, so that no state is silently left out).
        worker: What its calls run on: ``"threads"`` (the run's worker threads, its
            ``concurrency`` of them reserved), ``"processes"`` (worker processes of its own),
            ``"executor"`` (an executor given with it), or ``"loop"`` (the run's loop only).
        tunable: Its ``concurrency`` is a knob worth trying settings of
            (``dataclasses.replace(spec, concurrency=n)``): ``asyncflow.profile`` does.
    """

    ordered: bool = False
    per_item: bool = False
    grouping: Grouping = None
    keeps_items: bool = False
    stateful: bool = False
    worker: Worker = "threads"
    tunable: bool = False

    def __post_init__(self) -> None:
        check_flags(self, "ordered", "per_item", "keeps_items", "stateful", "tunable")
        if self.grouping not in _GROUPINGS:
            raise ConfigError(f"grouping must be one of {_GROUPINGS}, got {self.grouping!r}")
        if self.worker not in _WORKERS:
            raise ConfigError(f"worker must be one of {_WORKERS}, got {self.worker!r}")

    @property
    def replayable(self) -> bool:
        """Whether a run on just the inputs behind one output makes that output again, and
        only it: in order, per item, and not splitting items (what a journal's rebuild needs)."""
        return self.ordered and self.per_item and self.grouping != "elements"
