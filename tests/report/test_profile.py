"""``asyncflow.profile``: each stage at several concurrencies, with a recommendation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import asyncflow
from asyncflow import ConfigError, Pipeline
from asyncflow.report._profile import ProfileReport


async def _wait(x: int) -> int:
    await asyncio.sleep(0.01)  # latency-bound: more in flight is faster
    return x


def _spin(x: int) -> int:
    # Holds the GIL: more threads cannot make it faster.
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end:
        pass
    return x


def test_profile_measures_each_stage_and_recommends(leak_check: None) -> None:
    pipe = (
        Pipeline(range(10_000))
        .map(_wait, concurrency=1, name="fetch")
        .map(_spin, concurrency=4, name="spin")
        .batch(8)
    )
    report = asyncflow.profile(pipe, sample=80, concurrencies=(1, 4, 16))
    assert isinstance(report, ProfileReport)
    assert [s.name for s in report.stages] == ["fetch", "spin", "batch"]
    fetch, spin, batch = report.stages
    assert set(fetch.rates) == {1, 4, 16}
    assert fetch.items_in == fetch.items_out == 80
    # Latency-bound: 16 in flight beats 1 by far.
    assert fetch.rates[16] > 4 * fetch.rates[1]
    assert fetch.recommended == 16
    assert fetch.seconds_per_item >= 0.009
    assert spin.configured == 4 and spin.recommended in (1, 4, 16)
    assert batch.recommended is None and batch.items_out == 10
    assert report.recommended == {"fetch": 16, "spin": spin.recommended}
    assert report.bottleneck in ("fetch", "spin")


def test_apply_sets_the_recommended_concurrency() -> None:
    pipe = Pipeline(range(100)).map(_wait, name="fetch").batch(5)
    report = asyncflow.profile(pipe, sample=40, concurrencies=(1, 8))
    tuned = report.apply(pipe)
    assert tuned.stages[0].concurrency == 8
    assert pipe.stages[0].concurrency == 1  # the original is unchanged
    assert sum(len(b) for b in tuned) == 100


def test_report_prints_and_renders_html() -> None:
    pipe = Pipeline(range(100)).map(_wait, name="fetch")
    report = asyncflow.profile(pipe, sample=20, concurrencies=(1, 2))
    text = str(report)
    assert "c=1 items/s" in text and "c=2 items/s" in text and "recommended" in text
    assert "fetch" in text and "20 source items" in text
    html = report._repr_html_()
    assert "<table" in html and "<b>" in html and "asyncflow-bottleneck" in html


def test_failing_items_are_counted_not_fatal() -> None:
    def odd_fails(x: int) -> int:
        if x % 2:
            raise ValueError(x)
        return x

    pipe = Pipeline(range(20)).map(odd_fails, name="half")
    report = asyncflow.profile(pipe, sample=20, concurrencies=(1,))
    (stage,) = report.stages
    assert stage.failures == 10 and stage.items_out == 10
    assert "failures" in str(report).splitlines()[0]


def test_profiling_does_not_log_each_skipped_item(caplog: pytest.LogCaptureFixture) -> None:
    def fails(x: int) -> int:
        if x % 2:
            raise ValueError(x)
        return x

    asyncflow.profile(Pipeline(range(10)).map(fails), sample=10, concurrencies=(1, 2))
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_sample_larger_than_the_source() -> None:
    report = asyncflow.profile(Pipeline([1, 2, 3]).map(_wait), sample=100, concurrencies=(1,))
    assert report.stages[0].items_in == 3


def test_profile_leaves_the_pipeline_usable() -> None:
    pipe = Pipeline(range(10)).map(_spin)
    asyncflow.profile(pipe, sample=5, concurrencies=(1, 2))
    assert list(pipe) == list(range(10))


@pytest.mark.parametrize(
    "kwargs",
    [{"sample": 0}, {"concurrencies": ()}, {"concurrencies": (0, 1)}, {"tolerance": 1.5}],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        asyncflow.profile(Pipeline(range(3)).map(_spin), **kwargs)  # type: ignore[arg-type]


class _Window:
    """Two stages coupled as image.folder's decoders and batch stage are: ``produce`` may run
    at most ``ahead`` items past what ``consume`` (a later stage) has taken, and otherwise
    waits (softly: up to ``patience`` seconds per item) for it to catch up."""

    def __init__(self, ahead: int = 4, patience: float = 1.0) -> None:
        self.ahead = ahead
        self.patience = patience
        self.consumed = 0

    async def produce(self, x: int) -> int:
        deadline = time.monotonic() + self.patience
        while x >= self.consumed + self.ahead and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        return x

    def consume(self, x: int) -> int:
        self.consumed = max(self.consumed, x + 1)
        return x


@pytest.mark.timeout(60)
def test_a_stage_that_waits_on_a_later_stage_is_not_stalled(leak_check: None) -> None:
    # Profiled with nothing after it, ``produce`` would wait a second at each of 196 items.
    window = _Window()
    pipe = Pipeline(range(1000)).map(window.produce, name="produce").map(window.consume)
    report = asyncflow.profile(pipe, sample=200, concurrencies=(1, 2))
    produce, consume = report.stages
    assert produce.items_in == produce.items_out == 200
    assert consume.items_out == 200


def test_a_slow_stage_after_does_not_slow_the_measured_one() -> None:
    def slow(x: int) -> int:
        time.sleep(0.02)  # 40 times the fast stage's work: a loaded machine keeps the margin
        return x

    pipe = Pipeline(range(100)).map(_spin, name="fast").map(slow, name="slow")
    report = asyncflow.profile(pipe, sample=100, concurrencies=(1,))
    fast, slow_ = report.stages
    # The fast stage is timed up to its own last output, not the slow stage's.
    assert fast.best_rate > 2 * slow_.best_rate


@pytest.mark.timeout(120)
def test_profiling_image_folder_with_sample_200_does_not_stall(tmp_path: Path) -> None:
    # Its decoders claim batch rows that a later stage releases, and wait (a second per row)
    # when they run more than a few batches ahead: profiled alone, sample=200 took minutes.
    pytest.importorskip("torch")
    from asyncflow import image
    from tests.image._pictures import write_tree

    write_tree(tmp_path, {"a": 100, "b": 100}, size=(32, 24))
    pipe = image.folder(tmp_path, batch_size=2, size=16, decode_concurrency=2)
    report = asyncflow.profile(pipe, sample=200, concurrencies=(2, 4))
    decode = next(s for s in report.stages if s.name == "decode")
    assert decode.items_in == decode.items_out == 100  # groups of two: the whole tree
    assert decode.failures == 0
