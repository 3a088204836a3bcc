"""``Pipeline.cache(path)``: filling, replaying and shuffling through the engine."""

from __future__ import annotations

import asyncio
import gc
import logging
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import ConfigError, Pipeline, PipelineError, SourceError
from asyncflow.cache import CachedPipeline, _replay
from asyncflow.cache._cached import _layout
from asyncflow.cache._checks import Checks
from asyncflow.cache._format import HEADER_BYTES, leftovers
from asyncflow.cache._reader import Reader
from asyncflow.cache._writer import Writer


class Decode:
    """Stands in for decoding: counts its calls; image i is filled with i."""

    def __init__(self, size: int = 8, delay: float = 0.0) -> None:
        self.size, self.calls, self.delay = size, 0, delay

    def __call__(self, i: int) -> tuple[torch.Tensor, int]:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return torch.full((3, self.size, self.size), i % 256, dtype=torch.uint8), i


def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([image for image, _ in batch]), torch.tensor([i for _, i in batch])


def images(count: int = 10, batch: int = 4, decode: Decode | None = None,
           drop_last: bool = False) -> Pipeline:
    return Pipeline(range(count)).map(decode or Decode()).batch(
        batch, drop_last=drop_last).map(collate)


def labels(batches: Any) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


def flat(batches: Any) -> list[int]:
    return [label for batch in labels(batches) for label in batch]


def test_replay_equals_the_filling_pass_without_decoding(tmp_path: Path) -> None:
    decode = Decode()
    pipe = images(decode=decode).cache(tmp_path / "c")
    assert isinstance(pipe, CachedPipeline)
    first = list(pipe)
    assert decode.calls == 10
    second = list(pipe)
    assert decode.calls == 10
    assert labels(first) == labels(second) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for (a, _), (b, _) in zip(first, second, strict=True):
        assert torch.equal(a, b) and b.dtype == torch.uint8 and b.shape[1:] == (3, 8, 8)


def test_shuffle_with_the_epoch_as_seed(tmp_path: Path) -> None:
    decode = Decode()
    pipe = images(count=40, batch=8, decode=decode).cache(tmp_path / "c")
    orders = []
    for epoch in range(4):
        batches = list(pipe.shuffle(seed=epoch))
        assert [len(b[1]) for b in batches] == [8] * 5
        for image, label in batches:
            assert torch.equal(image[:, 0, 0, 0].long(), label)
        orders.append(flat(batches))
    assert decode.calls == 40
    assert orders[0] == list(range(40))  # the filling epoch keeps upstream's order
    assert all(sorted(order) == list(range(40)) for order in orders)
    assert len({tuple(order) for order in orders[1:]}) == 3
    assert flat(pipe.shuffle(seed=2)) == orders[2]


def test_drop_last_upstream_replays_whole_batches(tmp_path: Path) -> None:
    pipe = images(count=10, batch=4, drop_last=True).cache(tmp_path / "c")
    list(pipe)
    assert [len(b) for b in labels(pipe)] == [4, 4]
    assert [len(b) for b in labels(pipe.shuffle(seed=1))] == [4, 4]


def test_a_changed_stage_setting_rebuilds(tmp_path: Path, caplog: Any) -> None:
    list(images(batch=4).cache(tmp_path / "c"))
    caplog.set_level(logging.INFO, "asyncflow.cache")
    decode = Decode()
    assert labels(images(batch=5, decode=decode).cache(tmp_path / "c")) == [
        [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert decode.calls == 10
    assert "upstream[2]['size']: 4 -> 5" in caplog.text


def test_a_changed_source_listing_rebuilds(tmp_path: Path, caplog: Any) -> None:
    def pipe(files: list[str]) -> Pipeline:
        return Pipeline(files).map(lambda f: np.frombuffer(f.encode(), np.uint8)[:5])

    list(pipe(["a/1.jpg", "a/2.jpg"]).cache(tmp_path / "c"))
    caplog.set_level(logging.INFO, "asyncflow.cache")
    replay = pipe(["a/1.jpg", "a/2.jpg"]).cache(tmp_path / "c")
    assert [bytes(x).decode() for x in replay] == ["a/1.j", "a/2.j"]
    assert "rebuilding" not in caplog.text
    changed = pipe(["a/1.jpg", "b/2.jpg"]).cache(tmp_path / "c")
    assert [bytes(x).decode() for x in changed] == ["a/1.j", "b/2.j"]
    assert "listing" in caplog.text and "rebuilding" in caplog.text


def test_break_mid_fill_and_mid_replay_leaves_nothing_behind(
    tmp_path: Path, leak_check: None
) -> None:
    decode = Decode(delay=0.005)
    pipe = images(count=256, batch=4, decode=decode).cache(tmp_path / "c")
    with pipe.open() as run:
        for i, _ in enumerate(run):
            if i == 2:
                break
    assert not (tmp_path / "c").exists() and leftovers(tmp_path / "c") == []
    for i, _ in enumerate(pipe):  # a plain break: the run stops when its iterator is freed
        if i == 2:
            break
    del _
    deadline = time.monotonic() + 5
    while leftovers(tmp_path / "c") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not (tmp_path / "c").exists() and leftovers(tmp_path / "c") == []
    assert decode.calls < 256
    assert len(list(pipe)) == 64
    for i, _ in enumerate(pipe.shuffle(seed=0)):
        if i == 2:
            break


def _record_copies(monkeypatch: Any) -> list[int]:
    """The thread of each batch copy a replay makes from now on."""
    threads: list[int] = []
    copy_rows = _replay._copy_rows

    def recorded(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return copy_rows(*args)

    monkeypatch.setattr(_replay, "_copy_rows", recorded)
    return threads


def test_shuffled_batches_are_copied_in_the_consumers_thread_when_it_asks(
    tmp_path: Path, monkeypatch: Any, leak_check: None
) -> None:
    pipe = images(count=40, batch=4).cache(tmp_path / "c")
    list(pipe)  # fills
    threads = _record_copies(monkeypatch)
    with pipe.shuffle(seed=1).open() as run:
        first = next(run)
        time.sleep(0.05)  # the run's thread has queued what it may meanwhile
        assert threads == [threading.get_ident()]  # one batch asked for, one copied
        second = next(run)
        assert len(threads) == 2 and set(threads) == {threading.get_ident()}
    assert torch.equal(first[0][:, 0, 0, 0].long(), first[1])
    assert torch.equal(second[0][:, 0, 0, 0].long(), second[1])
    del first, second
    seen = set()
    for pixels, ids in pipe.shuffle(seed=2):  # holding a batch until the next arrives
        seen.add(pixels.data_ptr())
        assert torch.equal(pixels[:, 0, 0, 0].long(), ids)
    assert len(threads) == 12 and set(threads) == {threading.get_ident()}
    assert len(seen) == 2  # so two buffers take turns: nothing else holds a batch


def test_stages_after_a_shuffled_replay_get_batches_copied_ahead(
    tmp_path: Path, monkeypatch: Any
) -> None:
    pipe = images(count=40, batch=4).cache(tmp_path / "c")
    list(pipe)
    threads = _record_copies(monkeypatch)
    kinds = pipe.shuffle(seed=1).map(lambda b: type(b).__name__).prefetch(2)
    assert list(kinds) == ["tuple"] * 10
    assert len(threads) == 10 and threading.get_ident() not in threads
    batches = list(pipe.shuffle(seed=1).prefetch(2))
    assert sorted(flat(batches)) == list(range(40))


async def test_async_for(tmp_path: Path) -> None:
    pipe = images().cache(tmp_path / "c")
    first = [b async for b in pipe]
    second = [b async for b in pipe.shuffle(seed=3)]
    assert sorted(flat(second)) == flat(first)
    assert all(type(b) is tuple for b in second)  # copied on the consumer's loop


def test_variable_shapes_raise_config_error_naming_the_field(tmp_path: Path) -> None:
    sizes = iter([8, 8, 8, 8, 9, 9, 9, 9, 9, 9])
    pipe = Pipeline(range(10)).map(lambda i: Decode(next(sizes))(i)).batch(4).map(collate)
    with pytest.raises(PipelineError) as err:
        list(pipe.cache(tmp_path / "c"))
    assert err.group_contains(ConfigError, match=r"(?i)item\[0\] changed shape.*resize")
    assert not (tmp_path / "c").exists()


def test_stages_after_the_cache_and_their_shuffle(tmp_path: Path) -> None:
    pipe = images(count=12).cache(tmp_path / "c").map(lambda b: (b[0].float(), b[1]))
    assert [b[0].dtype for b in pipe] == [torch.float32] * 3
    shuffled = pipe.shuffle(buffer_size=2, seed=0)  # a buffer shuffle of those stages' output
    assert shuffled.describe()[-1]["kind"] == "shuffle"
    assert sorted(flat(shuffled)) == list(range(12))


def test_a_shuffled_replay_keeps_the_options_and_hooks_of_the_cached_pipeline(
    tmp_path: Path
) -> None:
    # shuffle() built a new CachedPipeline from upstream's options: what with_options() had
    # set on the cached pipeline (its name, stop_timeout, failure budget...) was dropped.
    seen: list[int] = []

    def hook(run: Any) -> Any:
        return lambda batch: seen.append(len(batch[1])) or batch

    pipe = images().cache(tmp_path / "c").with_options(name="train", stop_timeout=7.0)
    shuffled = pipe.with_hook(hook).shuffle(seed=1)
    assert shuffled.options == pipe.options and shuffled.options.name == "train"
    assert sorted(flat(shuffled)) == list(range(10)) and seen == [4, 4, 2]
    assert sorted(flat(shuffled)) == list(range(10))  # a replay, of the same options


def test_describe_and_info(tmp_path: Path) -> None:
    pipe = images().cache(tmp_path / "c").shuffle(seed=1)
    head = pipe.describe()[0]
    assert head["type"] == "cache" and head["seed"] == 1 and head["shuffle"] is True
    assert head["upstream"][2]["kind"] == "batch"
    list(pipe)
    info = pipe.info()  # type: ignore[attr-defined]
    assert info.usable and info.count == 10 and info.batch_size == 4


def test_samples_and_lists_of_samples(tmp_path: Path) -> None:
    samples = Pipeline(range(5)).map(lambda i: {"x": np.full(2, i), "y": i * 0.5})
    cached = samples.cache(tmp_path / "s")
    assert [d["y"] for d in cached] == [d["y"] for d in cached] == [0, 0.5, 1.0, 1.5, 2.0]
    lists = Pipeline(range(5)).map(lambda i: (np.full(2, i), i)).batch(2).cache(tmp_path / "l")
    assert [[y for _, y in b] for b in lists] == [[0, 1], [2, 3], [4]]
    assert [[y for _, y in b] for b in lists] == [[0, 1], [2, 3], [4]]


def test_layout_is_read_from_the_description() -> None:
    base = Pipeline(range(4))
    assert _layout(base, None) == "samples"
    assert _layout(base.batch(2), None) == "lists"
    assert _layout(base.batch(2).prefetch(2), None) == "lists"
    assert _layout(base.batch(2).map(collate), None) == "batches"
    assert _layout(base.batch(2).map(collate).unbatch(), None) == "samples"
    assert _layout(base.batch(2), True) == "batches"
    assert _layout(base.batch(2), False) == "samples"


@pytest.mark.parametrize(
    "options",
    [{"batched": "yes"}, {"wait": 1}, {"durable": None}],
)
def test_bad_options_raise_config_error(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        images().cache(tmp_path / "c", **options)


def test_bad_path_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="path"):
        images().cache(None)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_gpu_tensors_replay_onto_their_device(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pipe = images().map(lambda b: (b[0].cuda(), b[1].cuda())).cache(tmp_path / "c")
    first = list(pipe)
    second = list(pipe.shuffle(seed=0))  # copied on demand, in this thread
    assert all(b[0].is_cuda for b in second)
    assert sorted(flat(second)) == flat(first)
    for image, label in second:
        assert torch.equal(image[:, 0, 0, 0].long(), label)
    on_cpu = images().cache(tmp_path / "d")
    list(on_cpu)
    moved = list(on_cpu.shuffle(seed=1).to_device("cuda"))  # copied ahead, for the stage
    assert all(b[0].is_cuda and b[1].is_cuda for b in moved)
    assert sorted(flat(moved)) == list(range(10))
    for image, label in moved:
        assert torch.equal(image[:, 0, 0, 0].long(), label)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_the_kept_mapping_lives_as_long_as_the_pipeline(tmp_path: Path) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    pipe = images().cache(tmp_path / "c")
    list(pipe)  # fills
    gc.collect()  # earlier tests' pipelines in reference cycles: their mappings close now
    before = fds()
    for seed in range(3):  # shuffled copies share one kept mapping: one descriptor per field
        assert sorted(flat(pipe.shuffle(seed=seed))) == list(range(len(flat(pipe))))
    assert fds() == before + 2
    del pipe
    gc.collect()
    assert fds() == before


# -- damaged and stale data ---------------------------------------------------------------


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_flipped_byte_fails_the_epoch_naming_it_and_the_next_rebuilds(
    tmp_path: Path, caplog: Any, shuffled: bool
) -> None:
    decode = Decode(size=40)  # 4,800 bytes an image: a checksum each
    pipe = images(count=12, batch=4, decode=decode).cache(tmp_path / "c")
    expected = labels(pipe)
    with open(tmp_path / "c" / "field0.npy", "r+b") as fh:
        fh.seek(HEADER_BYTES + 9 * 4800 + 100)
        fh.write(b"\x01")
    epoch = pipe.shuffle(seed=1) if shuffled else pipe
    with pytest.raises(PipelineError) as err:
        list(epoch)
    assert [type(e) for e in err.value.exceptions] == [SourceError]
    assert str(err.value.exceptions[0]).startswith(
        f"cache {tmp_path / 'c'}: field0.npy (field item[0]) is damaged: row 9, bytes "
        f"{HEADER_BYTES + 9 * 4800}-{HEADER_BYTES + 10 * 4800 - 1} of the file")
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert labels(pipe) == expected and decode.calls == 24  # rebuilt
    assert "is damaged: row 9" in caplog.text and "rebuilding" in caplog.text
    assert labels(pipe) == expected and decode.calls == 24


def test_a_source_file_rewritten_in_place_rebuilds(tmp_path: Path, caplog: Any) -> None:
    files = [tmp_path / f"{i}.bin" for i in range(3)]
    for file in files:
        file.write_bytes(b"old!")

    def cached() -> Pipeline:
        read = lambda f: np.frombuffer(Path(f).read_bytes(), np.uint8)  # noqa: E731
        return Pipeline([str(f) for f in files]).map(read).cache(tmp_path / "c")

    assert [bytes(x) for x in cached()] == [b"old!"] * 3
    before = files[1].stat()
    files[1].write_bytes(b"new!")  # the same size
    os.utime(files[1], ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert [bytes(x) for x in cached()] == [b"old!", b"new!", b"old!"]
    assert "['mtime_ns']" in caplog.text and "rebuilding" in caplog.text


# -- blocking work stays off the run's event loop -------------------------------------------


def _record_threads(monkeypatch: Any) -> list[tuple[str, str, bool]]:
    """Patch the cache's writes, fsync, mapping and checks to record where each runs: the
    thread's name and whether an event loop runs in it."""
    calls: list[tuple[str, str, bool]] = []

    def record(what: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                on_loop = True
            except RuntimeError:
                on_loop = False
            calls.append((what, threading.current_thread().name, on_loop))
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(Writer, "write", record("write", Writer.write))
    monkeypatch.setattr(Writer, "commit", record("commit", Writer.commit))
    monkeypatch.setattr(Reader, "open", record("open", Reader.open))
    monkeypatch.setattr(Checks, "verify", record("verify", Checks.verify))
    monkeypatch.setattr(os, "fsync", record("fsync", os.fsync))
    monkeypatch.setattr(mmap, "mmap", record("mmap", mmap.mmap))
    return calls


def _assert_off_the_loops(calls: list[tuple[str, str, bool]], kinds: set[str]) -> None:
    assert {what for what, _, _ in calls} == kinds
    for what, thread, on_loop in calls:
        # asyncflow-pipeline: the run's loop thread (the cached run's and upstream's)
        assert thread != "asyncflow-pipeline" and not on_loop, (what, thread)


def test_writes_fsync_and_mapping_run_off_the_runs_loop(
    tmp_path: Path, monkeypatch: Any, leak_check: None
) -> None:
    calls = _record_threads(monkeypatch)
    pipe = images(count=12, batch=4, decode=Decode(size=40)).cache(tmp_path / "c", durable=True)
    list(pipe)  # fills: writes, commit, fsync
    _assert_off_the_loops(calls, {"open", "write", "commit", "fsync"})
    calls.clear()
    assert flat(pipe) == list(range(12))  # replays in order: maps and checks
    assert sorted(flat(pipe.shuffle(seed=1))) == list(range(12))
    assert flat(pipe.map(lambda b: b)) == list(range(12))  # a stage after it
    _assert_off_the_loops(calls, {"open", "mmap", "verify"})


async def test_async_for_maps_and_checks_off_every_loop(
    tmp_path: Path, monkeypatch: Any
) -> None:
    pipe = images(count=12, batch=4, decode=Decode(size=40)).cache(tmp_path / "c")
    calls = _record_threads(monkeypatch)
    assert flat([b async for b in pipe]) == list(range(12))
    assert sorted(flat([b async for b in pipe.shuffle(seed=2)])) == list(range(12))
    _assert_off_the_loops(calls, {"open", "write", "commit", "mmap", "verify"})


@pytest.mark.parametrize(
    ("field", "offset", "rows"),
    [("field0.npy", HEADER_BYTES + 9 * 4800 + 100, "row 9"),
     ("field1.npy", HEADER_BYTES + 8 * 5, "rows 0-11")],  # a label: its block holds them all
)
def test_a_flipped_byte_is_named_then_rebuilt_by_the_next_process(
    tmp_path: Path, field: str, offset: int, rows: str
) -> None:
    """Issue 25, point 5: a fresh pipeline (the next run of a script) over a cache damaged
    in a data or label byte raises naming the file and rows, and the one after rebuilds it,
    rather than failing forever or replaying nothing."""
    expected = labels(images(count=12, batch=4, decode=Decode(size=40)).cache(tmp_path / "c"))
    with open(tmp_path / "c" / field, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(PipelineError) as err:
        list(images(count=12, batch=4, decode=Decode(size=40)).cache(tmp_path / "c"))
    assert f"{field} (field item[{field[5]}]) is damaged: {rows}, bytes" in str(
        err.value.exceptions[0])
    decode = Decode(size=40)
    assert labels(images(count=12, batch=4, decode=decode).cache(tmp_path / "c")) == expected
    assert decode.calls == 12  # rebuilt
    decode = Decode(size=40)
    assert labels(images(count=12, batch=4, decode=decode).cache(tmp_path / "c")) == expected
    assert decode.calls == 0  # replayed


def test_a_damaged_header_in_a_fresh_pipeline_rebuilds_at_once(tmp_path: Path) -> None:
    expected = labels(images(count=12, batch=4, decode=Decode(size=40)).cache(tmp_path / "c"))
    with open(tmp_path / "c" / "field1.npy", "r+b") as fh:
        fh.seek(20)
        fh.write(b"\xff")
    decode = Decode(size=40)
    assert labels(images(count=12, batch=4, decode=decode).cache(tmp_path / "c")) == expected
    assert decode.calls == 12
