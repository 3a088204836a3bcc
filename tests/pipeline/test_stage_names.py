"""Stage names: ``describe()``, ``stats()`` and error notes name each stage alike, uniquely."""

from __future__ import annotations

import pytest

from asyncflow import Pipeline, PipelineError
from asyncflow.pipeline._spec import MapSpec, stage_names


def _inc(x: int) -> int:
    return x + 1


def _fail(x: int) -> int:
    raise ValueError(f"no {x}")


def test_a_taken_name_gets_a_number() -> None:
    specs = [MapSpec(fn=_inc), MapSpec(fn=_inc), MapSpec(fn=_inc, name="_inc#2"),
             MapSpec(fn=_inc, name="source")]
    assert stage_names(specs) == ["source", "_inc", "_inc#2", "_inc#2#2", "source#2"]


def test_describe_names_two_same_named_stages_as_stats_does() -> None:
    pipe = Pipeline(range(6)).map(lambda x: x).map(lambda x: x).map(_inc).map(_inc)
    list(pipe)
    described = [d["name"] for d in pipe.describe()]
    assert described == ["source", "map", "map#2", "_inc", "_inc#2"]
    assert [s.name for s in pipe.stats().stages] == described
    assert "map#2" in repr(pipe)


def test_an_error_note_names_the_stage_as_describe_does() -> None:
    pipe = Pipeline(range(3)).map(_inc).map(_fail, name="_inc")
    with pytest.raises(PipelineError) as info:
        list(pipe)
    assert pipe.describe()[2]["name"] == "_inc#2"
    assert "'_inc#2'" in " ".join(info.value.exceptions[0].__notes__)
