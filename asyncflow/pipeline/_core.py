"""``PipelineCore``: what every pipeline holds (source, stages, hooks, options), the public
seams through which features extend it, and how it runs, resumes and describes itself.

:class:`~asyncflow.Pipeline` adds the constructor and the fluent stage methods on top.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, cast

from .._errors import ConfigError, check_int, check_seconds
from ._build import build_run
from ._features import feature
from ._merge import Branch, Merge
from ._options import RunOptions, RunPlan
from ._pool_holder import PoolHolder
from ._resume import load_state, state_of
from ._run import ConsumerHook, Run, T_co
from ._runtime import Runtime
from ._shared_source import SharedSource, check_source
from ._spec import StageSpec, stage_names
from ._stats import PipelineStats

__all__ = ["HookFactory", "PipelineCore"]

#: Builds a run's consumer hook: ``factory(run) -> hook`` (see :meth:`PipelineCore.with_hook`).
HookFactory = Callable[[Run[Any]], ConsumerHook]


class PipelineCore(Generic[T_co]):
    """The state of a pipeline and the seams features use; see :class:`~asyncflow.Pipeline`.

    ``T_co`` is the type of the items a run yields. The seams here keep it: a stage added
    with :meth:`with_stage` is taken to yield what it receives (``cast`` the result to
    ``Pipeline[U]`` for a stage that changes the items), and the source given to
    :meth:`with_source` to hold what the old one held (its type is not checked: it feeds the
    first stage, not the output).
    """

    _source: SharedSource
    _stages: tuple[StageSpec, ...]
    _hooks: tuple[HookFactory, ...]
    _options: RunOptions
    _last: list[Runtime]
    _pools: PoolHolder

    # -- seams: derived pipelines -------------------------------------------------------

    def with_stage(self, spec: StageSpec) -> Self:
        """A copy of this pipeline with the stage ``spec`` appended.

        The way a feature adds a stage of its own kind: a :class:`~asyncflow.pipeline.CustomSpec`
        whose ``factory(ctx)`` builds the stage's node for each run (see
        ``asyncflow/pipeline/EXTENDING.md``). Subclasses keep their type and attributes; the
        copy has persistent workers of its own.

        Raises:
            ConfigError: ``spec`` is not a stage spec, or the last stage must stay last.
        """
        return self.with_stages((*self._stages, spec))

    def with_stages(self, stages: Sequence[StageSpec]) -> Self:
        """A copy of this pipeline over the same source with ``stages`` instead of its own
        (``pipe.stages`` with some replaced, for example by ``dataclasses.replace``).

        Raises:
            ConfigError: An entry is not a stage spec, or a stage that must be the last one
                (``to_device``) is followed by another.
        """
        stages = tuple(stages)
        for last, spec in zip((None, *stages), stages, strict=False):  # each with the one before
            if not isinstance(spec, StageSpec):
                raise ConfigError(f"not a stage spec: {spec!r:.80}")
            if last is not None and last.terminal:
                raise ConfigError(
                    f"{last.name or last.default_name()}() must be the last stage: the stages "
                    f"after it would receive batches still in flight (move {spec.kind}() "
                    "before it)"
                )
        # a new pipeline object: persistent workers of its own
        return self._copy(_stages=stages, _last=[], _pools=PoolHolder())

    def with_source(self, source: Any, *, epoch: int = 0, start: int = 0) -> Self:
        """The same stages over another source, sharing this pipeline's persistent workers.

        For a loader that builds each epoch's source itself (a new list of index batches),
        while its worker processes (``Processes(persistent=True)``) live on from epoch to
        epoch.

        Args:
            source: As for :class:`Pipeline`.
            epoch: The number of the copy's first run (it seeds shuffles and the per-item
                seeds of worker processes).
            start: The position in the epoch of ``source``'s first item, when it resumes an
                epoch part-way: per-item seeds then match those of an uninterrupted run.

        Raises:
            ConfigError: ``source`` is not an iterable, an async iterable or a callable, or
                ``epoch`` is not an int >= 0.
        """
        check_int("epoch", epoch, 0)
        check_int("start", start, 0)
        check_source("with_source(source)", source)
        return self._copy(_source=SharedSource(source, epoch=epoch, start=start), _last=[])

    def with_hook(self, factory: HookFactory) -> Self:
        """A copy with a consumer-side hook, built per run by ``factory(run)``.

        The hook is called in the consumer's thread when the run starts, then on every item
        (``hook(item) -> item``) before it is yielded, and ``hook.close()`` when the run is
        closed. The copy runs the same stages, so it shares this pipeline's latest-run
        statistics: ``pipe.stats()`` also shows a run of ``pipe.progress()``.
        """
        return self._copy(_hooks=(*self._hooks, factory))

    def without_hooks(self) -> Self:
        """A copy with no consumer-side hooks (no progress bar, say)."""
        return self._copy(_hooks=())

    def with_options(self, **changes: Any) -> Self:
        """A copy whose :class:`RunOptions` fields named in ``changes`` are replaced.

        Raises:
            ConfigError: A name is not a field of ``RunOptions``.
        """
        try:
            options = dataclasses.replace(self._options, **changes)
        except TypeError as exc:
            raise ConfigError(f"with_options(): {exc}") from None
        return self._copy(_options=options, _last=[])

    def _copy(self, **fields: Any) -> Self:
        """A copy of this pipeline with ``fields`` (its attributes) replaced: a ``_last`` of
        its own unless it runs the same stages, source and options (a hook's copy)."""
        new = copy.copy(self)
        vars(new).update(fields)
        return new

    @property
    def hooks(self) -> tuple[HookFactory, ...]:
        """The consumer-side hook factories, in the order they were added."""
        return self._hooks

    # -- running ------------------------------------------------------------------------

    def run_plan(self) -> RunPlan:
        """How the next run opens: its source opener, options and first receive hooks.

        Called once per run, in the consumer's thread, when the run starts. A subclass may
        override it to open the source another way or with other options, and to finish the
        items in the consumer's thread (``asyncflow.cache`` replays a cache so).
        """
        source = self._source
        opener = source.source if isinstance(source.source, Merge) else source.open
        return RunPlan(open_source=opener, options=self._options)

    def _branch(self, epoch: int | None = None) -> Branch:
        """A new epoch of this pipeline (``epoch``: that one, the count left as it is), for a
        merge that builds it into its own run (``_merge.py``): as :meth:`_runtime`, without
        a runtime of its own."""
        plan = self.run_plan()
        epoch, _, start = self._source.take_run(resume=False, at=epoch)
        stages = self._stages if plan.stages is None else plan.stages
        return Branch(plan=plan, stages=stages, epoch=epoch, start=start, pools=self._pools)

    def _runtime(self) -> Runtime:
        plan = self.run_plan()
        epoch, resume, start = self._source.take_run()
        stages = self._stages if plan.stages is None else plan.stages
        branch = Branch(plan=plan, stages=stages, epoch=epoch, start=start, pools=self._pools)
        rt = Runtime(*build_run(branch, resume))
        self._last[:] = [rt]
        return rt

    def open(self, *, timeout: float | None = None) -> Run[T_co]:
        """A new run, for ``with pipe.open() as run:`` or ``async with pipe.open() as run:``.

        Args:
            timeout: Raise ``StallError`` when no item arrives for this many seconds.
        """
        check_seconds("timeout", timeout, allow_none=True)
        return Run(self._runtime, timeout=timeout, hooks=self._hooks)

    def __iter__(self) -> Run[T_co]:
        return self.open()

    def __aiter__(self) -> Run[T_co]:
        return self.open()

    # -- the epoch and resuming ---------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Number the next run ``epoch``; later runs count on from it.

        The count is the pipeline's one epoch count, shared with the pipelines derived from
        it (``with_stage``, ``with_options``...): each run carries its number (``Run.epoch``,
        saved by :meth:`state_dict`), and what depends on it follows (a seeded ``shuffle``'s
        order, the per-item seeds of worker processes, ``image.folder``'s order and crops,
        what reads ``asyncflow.pipeline.current_epoch()``). A sampler source keeps its own
        rule: call its ``set_epoch`` for its order.

        Raises:
            ConfigError: ``epoch`` is not an int >= 0.
        """
        self._source.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the latest run stands, for resuming after a crash: plain JSON.

        It holds the source positions *settled* so far (every output of them received by
        the consumer, or none made: filtered, failed within the budget) as a watermark plus
        the ranges settled above it, each stage's extras (a ``flat_map``'s expansions
        delivered in part), the epoch, the failures so far by stage, the identity of the
        stages and the source, and ``offset`` (the watermark). A sampler source's own state
        is saved with it. Its size follows what is in flight, not the epoch's length; it is
        taken in the consumer's thread, in 0.05 to 1 ms (docs/reliability.md).

        :meth:`load_state_dict` on a new pipeline then makes its next run yield exactly the
        items not yet delivered: in the same order where the stages keep order, as the same
        multiset after ``map(ordered=False)`` or ``shuffle``. Before any run: the state of
        an epoch not yet started.

        Raises:
            ConfigError: A stage cannot report its position (a custom stage without
                ``settled_inputs`` or ``items_per_output``); the message names it.
        """
        last = self._last[0] if self._last else None
        return state_of(self._source.source, self.describe(), last)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`: the next run is the saved epoch, and
        yields exactly what that run had not delivered; the run after it, the next epoch.

        The saved epoch is the next run's (``Run.epoch``; ``current_epoch()`` for its
        stages and source): what depends on the epoch (a shuffled order, say) follows it.

        Raises:
            ConfigError: The state is from another pipeline (other stages, another source,
                a changed listing: the message says what differs), or it was cut or edited.
        """
        epoch, plan = load_state(self._source.source, self.describe(), state, self._stages)
        if epoch is not None:
            self._source.runs = self._source.first = epoch
        self._source.resume_plan = plan

    # -- introspection ------------------------------------------------------------------

    @property
    def source(self) -> Any:
        """The source given to the constructor."""
        return self._source.source

    @property
    def stages(self) -> tuple[StageSpec, ...]:
        """The stage specs after the source, in order."""
        return self._stages

    @property
    def options(self) -> RunOptions:
        return self._options

    def stats(self) -> PipelineStats:
        """Statistics of the latest run of this pipeline object (during or after it)."""
        return self._last[0].snapshot() if self._last else PipelineStats()

    def describe(self) -> list[dict[str, Any]]:
        """A JSON-able description: the source, then each stage's kind, name and settings.

        Stages are named as ``stats()`` names them: unique, a second unnamed ``map`` is
        ``map#2``.
        """
        names = stage_names(self._stages)
        out: list[dict[str, Any]] = [
            {"kind": "source", "name": names[0], **self._source.describe()}
        ]
        for name, spec in zip(names[1:], self._stages, strict=True):
            out.append({"kind": spec.kind, "name": name, **spec.settings()})
        return out

    def __repr__(self) -> str:
        parts = [f"Pipeline({type(self._source.source).__name__})"]
        for stage in self.describe()[1:]:
            settings = ", ".join(
                f"{k}={v}" for k, v in stage.items() if k not in ("kind", "name") and v is not None
                and not (k == "fn" and v == stage["name"])
            )
            parts.append(f".{stage['kind']}({stage['name']}{', ' if settings else ''}{settings})")
        return "\n    ".join(parts)

    def _repr_html_(self) -> str:
        return cast(str, feature("pipeline_html")(self))
