"""``pipe.progress()``: a tqdm bar per run, counted on the consumer's side."""

from __future__ import annotations

import io
import threading
import time

import pytest

from asyncflow import ConfigError, Pipeline
from asyncflow.report._progress import ProgressBar, _bar_class, in_notebook, progress_hook


def _slow(x: int) -> int:
    time.sleep(0.001)
    return x


def _bars(pipe: Pipeline) -> list[ProgressBar]:
    """Run ``pipe`` once, keeping the hooks the run built."""
    made: list[ProgressBar] = []
    factory = pipe.hooks[-1]

    def spy(run: object) -> ProgressBar:
        bar = factory(run)
        made.append(bar)
        return bar

    spied = pipe.without_hooks()
    for hook in (*pipe.hooks[:-1], spy):
        spied = spied.with_hook(hook)
    for _ in spied:
        pass
    return made


def test_counts_every_item_and_closes(leak_check: None) -> None:
    out = io.StringIO()
    pipe = Pipeline(range(50)).map(_slow, concurrency=2).progress(file=out, desc="work")
    (bar,) = _bars(pipe)
    assert bar.bar.n == 50
    text = out.getvalue()
    assert "work" in text and "50/50" not in text  # no total given: no fraction
    assert "50it" in text
    assert bar.bar.disable  # tqdm disables a bar when it is closed


def test_total_unit_and_count(leak_check: None) -> None:
    out = io.StringIO()
    pipe = (
        Pipeline(range(40)).batch(8)
        .progress(file=out, total=40, unit="img", count=len)
    )
    (bar,) = _bars(pipe)
    assert bar.bar.n == 40
    assert "40/40" in out.getvalue() and "img" in out.getvalue()


def test_postfix_names_the_bottleneck(leak_check: None) -> None:
    out = io.StringIO()
    pipe = Pipeline(range(20)).map(_slow, name="sleepy").progress(file=out, interval=0.0)
    (bar,) = _bars(pipe)
    assert "bottleneck: sleepy" in out.getvalue()
    assert bar.bar.postfix and "sleepy" in bar.bar.postfix


def test_break_closes_the_bar(leak_check: None) -> None:
    out = io.StringIO()
    pipe = Pipeline(range(10_000)).map(_slow, concurrency=2).progress(file=out)
    with pipe.open() as run:
        for i, _ in enumerate(run):
            if i == 5:
                break
    assert "6it" in out.getvalue()


async def test_async_for(async_leak_check: None) -> None:
    out = io.StringIO()
    pipe = Pipeline(range(30)).progress(file=out, total=30)
    seen = [x async for x in pipe]
    assert seen == list(range(30))
    assert "30/30" in out.getvalue()


def test_each_epoch_gets_its_own_bar(leak_check: None) -> None:
    out = io.StringIO()
    pipe = Pipeline(range(5)).progress(file=out, desc="epoch")
    for _ in range(3):
        assert list(pipe) == [0, 1, 2, 3, 4]
    assert out.getvalue().count("5it") >= 3


def test_no_monitor_thread_is_left(leak_check: None) -> None:
    before = threading.active_count()
    pipe = Pipeline(range(5)).progress(file=io.StringIO())
    list(pipe)
    assert threading.active_count() <= before


def test_outside_a_notebook_the_bar_is_text() -> None:
    from tqdm.std import tqdm

    assert not in_notebook()
    assert _bar_class(None).__bases__ == (tqdm,)  # without its monitor thread


def test_bad_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        progress_hook(count=3)


def test_progress_keeps_the_pipeline_type() -> None:
    pipe = Pipeline(range(3))
    assert type(pipe.progress()) is Pipeline
    assert list(pipe.progress(file=io.StringIO())) == [0, 1, 2]


def test_progress_true_on_the_constructor_shows_a_bar(capsys) -> None:
    from asyncflow import Pipeline

    assert list(Pipeline(range(50), progress=True).map(lambda x: x)) == list(range(50))
    err = capsys.readouterr().err
    assert "50/" in err or "50it" in err, err
