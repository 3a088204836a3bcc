"""The engine's public seams: derived pipelines, consumer hooks, run plans, the feature registry."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, Retry
from asyncflow.pipeline import CustomSpec, Run, RunPlan, feature, register_feature


def _terminal() -> CustomSpec:
    return CustomSpec(label="to_device", factory=lambda ctx: None, terminal=True)  # type: ignore[arg-type,return-value]


def test_with_stage_appends_and_keeps_the_type() -> None:
    class Mine(Pipeline):
        pass

    pipe = Mine(range(4)).map(lambda x: x + 1)
    doubled = pipe.with_stage(dataclasses.replace(pipe.stages[0], name="again"))
    assert type(doubled) is Mine
    assert [s.name for s in doubled.stages] == [None, "again"]
    assert list(doubled) == [2, 3, 4, 5]  # two maps, each adding one


def test_with_stage_rejects_what_is_not_a_spec() -> None:
    with pytest.raises(ConfigError, match="not a stage spec"):
        Pipeline(range(3)).with_stage("map")  # type: ignore[arg-type]


def test_with_stages_keeps_a_terminal_stage_last() -> None:
    pipe = Pipeline(range(3)).batch(2)
    with pytest.raises(ConfigError, match="to_device\\(\\) must be the last stage"):
        pipe.with_stages((_terminal(), *pipe.stages))
    assert pipe.with_stages((*pipe.stages, _terminal())).stages[-1].terminal  # type: ignore[attr-defined]


def test_with_stages_replaces_the_stages() -> None:
    pipe = Pipeline(range(6)).map(lambda x: x * 10, concurrency=2).batch(4)
    faster = pipe.with_stages(
        [dataclasses.replace(s, concurrency=4) if s.kind == "map" else s  # type: ignore[call-arg]
         for s in pipe.stages]
    )
    assert faster.stages[0].concurrency == 4  # type: ignore[attr-defined]
    assert list(faster) == list(pipe) == [[0, 10, 20, 30], [40, 50]]


def test_with_options_replaces_fields_and_rejects_unknown_ones() -> None:
    pipe = Pipeline(range(3), name="a")
    assert pipe.with_options(name="b").options.name == "b"
    assert pipe.options.name == "a"
    with pytest.raises(ConfigError, match="with_options"):
        pipe.with_options(colour="red")


def test_hooks_are_listed_and_can_be_dropped() -> None:
    seen: list[Any] = []

    class Spy:
        def __init__(self, run: Run) -> None:
            self.run = run

        def __call__(self, item: Any) -> Any:
            seen.append(item)
            return item

        def close(self) -> None:
            seen.append("closed")

    pipe = Pipeline(range(3)).with_hook(Spy)
    assert pipe.hooks == (Spy,)
    assert list(pipe) == [0, 1, 2] and seen == [0, 1, 2, "closed"]
    assert pipe.without_hooks().hooks == ()
    assert list(pipe.without_hooks()) == [0, 1, 2] and len(seen) == 4


def test_a_subclass_opens_its_runs_through_run_plan() -> None:
    class Doubled(Pipeline):
        def run_plan(self) -> RunPlan:
            plan = super().run_plan()
            return RunPlan(open_source=lambda: [10, 20], options=plan.options,
                           receive_hooks=(lambda x: x + 1, *plan.receive_hooks))

    pipe = Doubled(range(3))
    assert list(pipe) == [11, 21]
    assert list(pipe.map(lambda x: x * 2)) == [21, 41]  # hooks run after the stages


def test_the_feature_methods_look_their_implementation_up() -> None:
    calls: list[tuple[Any, ...]] = []
    original = feature("cache")

    def fake_cache(pipe: Pipeline, path: str, **options: Any) -> Pipeline:
        calls.append((pipe, path, options))
        return pipe

    register_feature("cache", fake_cache)
    try:
        pipe = Pipeline(range(3))
        assert pipe.cache("somewhere", wait=True) is pipe
        assert calls == [(pipe, "somewhere", {"wait": True})]
    finally:
        register_feature("cache", original)
    assert feature("cache") is original


def test_a_lazy_feature_is_imported_on_first_use() -> None:
    register_feature("test-lazy", "asyncflow.sources._retry:Retry")
    assert feature("test-lazy") is Retry


def test_an_unknown_feature_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no feature 'nothing' is registered"):
        feature("nothing")
    with pytest.raises(ConfigError, match="module:attribute"):
        register_feature("bad", "no-colon")


def test_retry_and_timeout_are_checked_against_the_registered_classes() -> None:
    with pytest.raises(ConfigError, match=r"retry must be an asyncflow\.Retry"):
        Pipeline(range(3), retry=3)
    Pipeline(range(3), retry=Retry(attempts=2))
