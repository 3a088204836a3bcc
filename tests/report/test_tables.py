"""Text and HTML rendering of pipelines and their statistics."""

from __future__ import annotations

import asyncio
import re

from asyncflow import Pipeline
from asyncflow.pipeline import FailureRecord, PipelineStats, StageStats
from asyncflow.report._tables import (
    pipeline_html,
    pipeline_text,
    stages_text,
    stats_html,
    stats_text,
    table_text,
)


def _stage(name: str, *, utilization: float = 0.1, failures: int = 0, **kw: object) -> StageStats:
    base: dict[str, object] = dict(
        name=name, kind="map", concurrency=2, items_in=1000, items_out=1000 - failures,
        failures=failures, failed_items=(), busy_seconds=1.0, mean_seconds_per_item=0.002,
        utilization=utilization, in_flight=0, queue_fill=3, queue_capacity=8,
        mean_queue_fill=4.0, items_per_second=500.0,
    )
    base.update(kw)
    return StageStats(**base)  # type: ignore[arg-type]


def _stats(**kw: object) -> PipelineStats:
    failures = (FailureRecord("decode", "'bad.jpg'", "DecodeError", "truncated file"),)
    base: dict[str, object] = dict(
        stages=(
            _stage("source", kind="source", concurrency=1, items_in=0),
            _stage("decode", utilization=0.97, failures=1, failed_items=failures),
            _stage("<collate>", kind="map"),
        ),
        elapsed=2.0,
        delivered=999,
        running=False,
        bottleneck="decode",
    )
    base.update(kw)
    return PipelineStats(**base)  # type: ignore[arg-type]


def test_table_text_aligns_columns() -> None:
    text = table_text(["name", "n"], [["a", "1"], ["longer", "1000"]])
    lines = text.splitlines()
    assert lines[0].startswith("name  ")
    assert lines[2] == "a          1"
    assert lines[3] == "longer  1000"
    assert len({len(line) for line in lines[1:]}) == 1


def test_stats_text_has_every_column_and_marks_the_bottleneck() -> None:
    text = stats_text(_stats())
    header = text.splitlines()[0]
    for column in ("stage", "items/s", "busy", "queue", "failures"):
        assert column in header
    decode = next(line for line in text.splitlines() if line.startswith("decode"))
    assert decode.startswith("decode *")
    assert "97%" in decode  # busy
    assert "500" in decode  # items_per_second: 1,000 items handled / 2 s
    assert "3/8" in decode  # queue fill now / capacity
    assert "bottleneck: decode" in text
    assert "finished: 999 items in 2.00 s" in text
    assert "DecodeError: truncated file" in text and "'bad.jpg'" in text


def test_stats_text_names_the_consumer_as_bottleneck() -> None:
    text = stats_text(_stats(bottleneck="consumer", running=True))
    assert "running:" in text
    assert "the consumer" in text


def test_stats_text_of_an_empty_snapshot() -> None:
    assert "no run yet" in stats_text(PipelineStats())
    assert "no run yet" in stats_html(PipelineStats())


def test_stats_html_highlights_and_escapes() -> None:
    html = stats_html(_stats())
    assert "<table" in html
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html, flags=re.S)
    marked = [row for row in rows if "asyncflow-bottleneck" in row]
    assert len(marked) == 1 and ">decode<" in marked[0]
    assert "&lt;collate&gt;" in html and "<collate>" not in html
    assert "bottleneck: decode" in html


def test_notes_and_abandoned_stages_are_shown() -> None:
    stats = _stats(
        stages=(_stage("stuck", abandoned=True),), notes=("stage 'stuck' was abandoned",),
        bottleneck=None,
    )
    text = stats_text(stats)
    assert "stuck (abandoned)" in text
    assert "note: stage 'stuck' was abandoned" in text
    assert "note:" in stats_html(stats)


def test_pipeline_description_before_and_after_a_run(leak_check: None) -> None:
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x

    pipe = Pipeline(range(100)).map(fetch, concurrency=8).map(str, name="fmt").batch(10)
    text = pipeline_text(pipe)
    assert "a source and 3 stages" in text
    assert re.search(r"1\s+fetch\s+map\s+fetch\s+8", text)
    assert "runs_on=loop" in text and "size=10" in text
    assert "latest run" not in text

    assert sum(len(b) for b in pipe) == 100
    text = pipeline_text(pipe)
    assert "latest run" in text and "finished: 10 items" in text
    html = pipeline_html(pipe)
    assert html.count("<table") == 2


def test_pipeline_repr_html_uses_the_display() -> None:
    pipe = Pipeline([1, 2, 3]).map(lambda x: x, name="ident")
    html = pipe._repr_html_()
    assert "ident" in html and "<table" in html
    assert "no run yet" in pipe.stats()._repr_html_()
    assert list(pipe) == [1, 2, 3]
    assert pipe.stats()._repr_html_().count("<table") == 1
    assert str(pipe.stats()).startswith("stage")


def test_stages_text_shows_a_callable_source_by_name() -> None:
    def make() -> list[int]:
        return [1]

    text = stages_text(Pipeline(make).describe())
    assert "make()" in text


def test_failures_notes_and_settings_are_shown_redacted() -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    url = f"https://alice:hunter2@host/a.jpg?X-Amz-Signature={secret[:12]}"
    leaky = FailureRecord("fetch", repr(url), "ClientError",
                          f"aws_secret_access_key={secret} refused for {url}")
    stats = _stats(
        stages=(_stage("fetch", failures=1, failed_items=(leaky,)),),
        notes=(f"the consumer stopped before it was given the run's error: {url}",),
        bottleneck=None,
    )
    for shown in (stats_text(stats), stats_html(stats)):
        assert "ClientError" in shown and "host/a.jpg" in shown
        for part in (secret, secret[:12], "hunter2"):
            assert part not in shown, shown
    described = pipeline_text(Pipeline([url]).map(str, name="fetch"))
    assert "hunter2" not in described


def _with_internal(**kw: object) -> PipelineStats:
    return _stats(
        stages=(
            _stage("source", kind="source", concurrency=1, items_in=0),
            _stage("claim", internal=True, utilization=0.9),
            _stage("decode", utilization=0.5),
            _stage("rows", kind="unbatch", internal=True),
        ),
        **kw,
    )


def test_internal_stages_are_hidden_and_named_below_the_table() -> None:
    text = stats_text(_with_internal())
    names = [line.split()[0] for line in text.splitlines()[2:6] if line and line[0] != " "]
    assert names[:2] == ["source", "decode"]
    assert not any(line.startswith(("claim", "rows")) for line in text.splitlines())
    assert "internal stages hidden: claim, rows" in text
    assert "internal stages hidden: claim, rows" in stats_html(_with_internal())
    assert "claim" not in re.sub(r"<pre>.*</pre>", "", stats_html(_with_internal()), flags=re.S)


def test_internal_stages_are_listed_and_marked_when_asked() -> None:
    stats = _with_internal()
    text = stats.table(internal=True)
    assert any(line.startswith("claim (internal)") for line in text.splitlines())
    assert any(line.startswith("rows (internal)") for line in text.splitlines())
    assert "hidden" not in text
    assert str(stats) == stats_text(stats)  # the default: hidden


def test_items_per_second_is_the_stage_s_own_rate() -> None:
    stats = _stats(stages=(_stage("batch", kind="batch", items_in=1000, items_out=10,
                                  items_per_second=1234.0),))
    line = next(x for x in stats_text(stats).splitlines() if x.startswith("batch"))
    assert "1,234" in line
