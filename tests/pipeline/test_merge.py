"""Merge: several pipelines read as branches of one run (one loop thread, one Runtime)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import asyncflow
import asyncflow.pipeline
from asyncflow import ConfigError, Pipeline, PipelineError, StallError, mix
from asyncflow._scope import current_scope
from asyncflow.pipeline import BranchEnd, Merge, RunPlan, _runtime


@dataclass
class RoundRobin:
    """Takes one item from each live branch in turn; restarts branch ``again`` ``times``
    times, drops the others when they run out."""

    again: int = -1
    times: int = 0
    epochs: list[int] = field(default_factory=list)

    def open(self, epoch: int, branches: int) -> _Turns:
        self.epochs.append(epoch)
        return _Turns(self, branches)


class _Turns:
    def __init__(self, policy: RoundRobin, branches: int) -> None:
        self.policy = policy
        self.live = list(range(branches))
        self.turn = 0
        self.restarts = 0

    def choose(self) -> int | None:
        if not self.live:
            return None
        self.turn = (self.turn + 1) % len(self.live)
        return self.live[self.turn]

    def ended(self, branch: int, *, empty: bool) -> BranchEnd:
        if branch == self.policy.again and self.restarts < self.policy.times and not empty:
            self.restarts += 1
            return "restart"
        self.live.remove(branch)
        self.turn -= 1
        return "drop"


def loop_threads() -> list[str]:
    """Names of the asyncflow run threads (one per run; not the worker threads)."""
    return sorted(
        t.name for t in threading.enumerate()
        if t.name.startswith("asyncflow-") and "-worker" not in t.name
    )


def take(pipe: Pipeline, count: int) -> tuple[list[Any], set[tuple[str, ...]]]:
    """The first ``count`` items of a run, and the run threads alive as each came (the
    inputs are long enough that the run cannot end meanwhile)."""
    items, threads = [], set()
    with pipe.open() as run:
        for item in run:
            threads.add(tuple(loop_threads()))
            items.append(item)
            if len(items) == count:
                break
    return items, threads


def test_a_mix_of_three_pipelines_is_one_run(
    leak_check: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtimes: list[Any] = []
    original = _runtime.Runtime.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        runtimes.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(_runtime.Runtime, "__init__", counting)
    seen: set[str] = set()

    async def where(x: int) -> int:  # async stages run on their run's loop thread
        seen.add(threading.current_thread().name)
        return x

    inputs = [Pipeline(range(10**6), name=n).map(where, name="tag") for n in "abc"]
    items, threads = take(mix(inputs, stop="all", seed=2), 300)
    assert len(items) == 300
    assert len(runtimes) == 1
    assert threads == {("asyncflow-mix",)}
    assert seen == {"asyncflow-mix"}


def test_stats_name_each_branch_stage_after_its_input() -> None:
    web = Pipeline(range(20), name="web").map(lambda x: x, name="decode")
    books = Pipeline(range(10), name="books")
    mixed = mix([web, books, Pipeline(range(5))], stop="all").map(lambda x: x, name="after")
    assert len(list(mixed)) == 35
    stats = mixed.stats()
    assert [s.name for s in stats.stages] == [
        "web/source", "web/decode", "books/source", "input2/source", "mix", "after",
    ]
    assert stats["web/decode"].items_out == 20
    assert stats["mix"].kind == "merge" and stats["mix"].items_out == 35
    assert mixed.describe()[0]["inputs"] == ["web", "books", "input2"]


def test_restart_builds_a_new_epoch_of_the_input_in_the_same_run(leak_check: None) -> None:
    epochs: list[int] = []

    def numbered() -> list[tuple[int, int]]:  # called once per epoch of the input
        epochs.append(len(epochs))
        return [(epochs[-1], i) for i in range(3)]

    policy = RoundRobin(again=1, times=2)
    short = Pipeline(numbered, name="short").map(lambda x: x, name="same")
    long = Pipeline(("long", i) for i in range(10**6))
    merged = Pipeline(Merge([long, short], policy), name="merged")
    items, threads = take(merged, 40)
    assert threads == {("asyncflow-merged",)}
    assert [x for x in items if x[0] != "long"] == [(e, i) for e in range(3) for i in range(3)]
    assert epochs == [0, 1, 2]
    stats = merged.stats()
    # One row per stage of the input, counting across its three epochs.
    assert [s.name for s in stats.stages if s.name.startswith("short/")] == [
        "short/source", "short/same",
    ]
    assert stats["short/same"].items_out == 9


def test_cycle_restarts_in_run_and_picks_stay_reproducible(leak_check: None) -> None:
    def make(n: int) -> Pipeline:
        return mix([Pipeline(range(n), name="a"), Pipeline(range(3), name="b")],
                   stop="cycle", seed=5)

    first = make(10**6)
    items, threads = take(first, 200)
    assert threads == {("asyncflow-mix",)}
    assert first.stats()["b/source"].items_out > 3
    assert items == take(make(10**6), 200)[0]
    short = list(make(40))
    assert [i for i in short if i >= 3] == list(range(3, 40))
    assert short[:len(items)] == items[:len(short)]


def test_restarted_branches_on_worker_processes_leave_none_behind(leak_check: None) -> None:
    # Each epoch of "procs" starts its own worker processes: a restart shuts the old ones
    # down (the branch's stop callbacks), the end of the run the last ones.
    procs = Pipeline(range(-4, 0), name="procs").map(abs, workers="processes", name="abs")
    long = Pipeline(range(100, 130), name="long")
    items = list(mix([procs, long], stop="cycle", seed=3))
    assert [i for i in items if i >= 100] == list(range(100, 130))
    from_procs = [i for i in items if i < 100]
    assert len(from_procs) > 4
    assert from_procs == ([4, 3, 2, 1] * len(from_procs))[: len(from_procs)]


def test_a_failing_branch_fails_the_run_naming_its_stage(leak_check: None) -> None:
    def boom(x: int) -> int:
        if x == 7:
            raise ValueError("bad item")
        return x

    bad = Pipeline(range(100), name="bad").map(boom, name="boom")
    good = Pipeline(range(10**6), name="good")
    with pytest.raises(PipelineError) as info:
        list(mix([bad, good], stop="never"))
    assert info.group_contains(ValueError)
    error = info.value.exceptions[0]
    assert any("stage 'bad/boom'" in note for note in error.__notes__)


def test_an_input_that_cannot_restart_fails_the_run_naming_the_merge(
    leak_check: None,
) -> None:
    once = Pipeline(iter([1, 2]), name="once")  # an iterator: one epoch only
    with pytest.raises(PipelineError) as info:
        list(mix([once, Pipeline(range(10**6))], stop="cycle"))
    assert info.group_contains(ConfigError, match="can be read once")
    assert any("stage 'mix'" in n for n in info.value.exceptions[0].__notes__)


def test_a_stalled_branch_is_named(leak_check: None) -> None:
    async def hang(x: int) -> int:
        if x == 3:
            await asyncio.Event().wait()
        return x

    slow = Pipeline(range(10), name="slow").map(hang, name="hang")
    merged = Pipeline(Merge([slow, Pipeline(range(10))], RoundRobin()), stall_timeout=0.2)
    with pytest.raises(PipelineError) as info:
        list(merged)
    assert info.group_contains(StallError, match="slow/hang")


def test_the_end_of_the_merge_stops_branches_still_waiting(leak_check: None) -> None:
    async def forever() -> AsyncIterator[int]:
        yield -1
        await asyncio.Event().wait()

    # weight 0: never picked, so the mix ends with "first" when "a" runs out; the other
    # branch, blocked in its source, is cancelled rather than waited for.
    mixed = mix([Pipeline(range(5), name="a"), Pipeline(forever)], weights=[1, 0])
    assert list(mixed) == list(range(5))


def test_input_run_plans_and_receive_hooks_are_honoured() -> None:
    class Replayed(Pipeline[int]):
        def run_plan(self) -> RunPlan:
            plan = super().run_plan()
            return RunPlan(open_source=lambda: [10, 20], options=plan.options,
                           receive_hooks=(lambda x: x + 1,))

    merged = mix([Replayed([0]), Pipeline([5])], stop="all", seed=0)
    assert sorted(merged) == [5, 11, 21]


def test_each_branch_reads_its_own_pipeline_settings() -> None:
    retry = asyncflow.Retry(attempts=7)
    seen: dict[str, Any] = {}

    def probe(tag: str) -> Callable[[int], Any]:
        async def fn(x: int) -> int:
            scope = current_scope()
            assert scope is not None
            seen[tag] = scope.settings.get("retry")
            return x
        return fn

    read = Pipeline([1], name="read", retry=retry).map(probe("branch"))
    merged = mix([read, Pipeline([2])], stop="all").map(probe("mix"))
    assert sorted(merged) == [1, 2]
    assert seen == {"branch": retry, "mix": None}


def test_a_mix_of_mixes_is_still_one_run(leak_check: None) -> None:
    def make(n: int) -> Pipeline:
        inner = mix([Pipeline(range(n), name="x"), Pipeline(range(n), name="y")], stop="all")
        return mix([inner, Pipeline(range(n), name="z")], stop="all")

    assert take(make(10**6), 100)[1] == {("asyncflow-mix",)}
    outer = make(10)
    assert sorted(outer) == sorted([*range(10), *range(10), *range(10)])
    names = [s.name for s in outer.stats().stages]
    assert names == ["mix/x/source", "mix/y/source", "mix/mix", "z/source", "mix"]


def test_a_gate_holds_the_branches_until_it_opens(leak_check: None) -> None:
    opened: list[int] = []

    def source() -> range:
        opened.append(1)
        return range(5)

    async def shut() -> bool:
        return False

    async def later() -> bool:
        await asyncio.sleep(0.01)
        return True

    class Held(Pipeline[int]):
        """A merged pipeline whose run plan holds the merge at a gate (as a cache fill's)."""

        def __init__(self, gate: Callable[[], Awaitable[bool]]) -> None:
            super().__init__(Merge([Pipeline(source, name="held")], RoundRobin()))
            self.gate = gate

        def run_plan(self) -> RunPlan:
            return dataclasses.replace(super().run_plan(), gate=self.gate)

    closed = Held(shut)
    assert list(closed) == []
    assert opened == []  # its source was never opened
    assert closed.stats()["held/source"].items_out == 0
    assert list(Held(later)) == list(range(5))
    assert opened == [1]


def test_a_policy_choosing_a_missing_branch_fails_the_run() -> None:
    class Wrong:
        def open(self, epoch: int, branches: int) -> Any:
            return self

        def choose(self) -> int:
            return 5

        def ended(self, branch: int, *, empty: bool) -> BranchEnd:
            return "stop"

    with pytest.raises(PipelineError) as info:
        list(Pipeline(Merge([Pipeline([1])], Wrong())))
    assert info.group_contains(ConfigError, match="branch 5")


def test_a_merge_needs_pipelines() -> None:
    with pytest.raises(ConfigError):
        Merge([], RoundRobin())
    with pytest.raises(ConfigError):
        Merge([[1, 2]], RoundRobin())  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="opened as a plain source"):
        Merge([Pipeline([1])], RoundRobin())()


def test_the_extending_example_of_a_merge_policy_runs(leak_check: None) -> None:
    text = Path(asyncflow.pipeline.__file__).with_name("EXTENDING.md").read_text()
    [example] = [b for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
                 if "Merge(" in b]
    exec(compile(example, "EXTENDING.md", "exec"), {"__name__": "merge_example"})
