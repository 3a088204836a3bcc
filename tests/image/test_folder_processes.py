"""image.folder on worker processes: shared-memory batch rows, the same batches as threads."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from asyncflow import ConfigError, DecodeError, PipelineError, Processes, image
from asyncflow.workers import SHM_DIR

from ._pictures import jpeg, write_tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 7, "dog": 6, "ant": 5})
    return root


def _epochs(pipe: object, n: int = 2, hold: bool = False) -> list[list[tuple[torch.Tensor, ...]]]:
    """``n`` epochs of batches; copies, unless ``hold`` keeps the batches themselves (then
    the pipeline needs more buffers than its pool keeps)."""
    out = []
    for _ in range(n):
        batches = []
        for x, y in pipe:  # type: ignore[attr-defined]
            batches.append((x, y) if hold else (x.clone(), y.clone()))
        out.append(batches)
    return out


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("hold", [False, True])
def test_processes_give_the_batches_of_threads_bit_for_bit(
    tree: Path, normalize: bool, hold: bool, leak_check: None
) -> None:
    options = {"batch_size": 2, "size": 24, "train": True, "seed": 11, "normalize": normalize}
    threads = _epochs(image.folder(tree, workers="threads", **options), hold=hold)
    pipe = image.folder(tree, workers="processes", decode_concurrency=2, **options)
    processes = _epochs(pipe, hold=hold)
    assert len(processes[0]) == 9
    for epoch_t, epoch_p in zip(threads, processes, strict=True):
        for (xt, yt), (xp, yp) in zip(epoch_t, epoch_p, strict=True):
            assert torch.equal(xt, xp) and torch.equal(yt, yp)
    # two epochs differ (reshuffled, new crops), in both modes alike
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(*processes, strict=True))
    del pipe, threads, processes
    gc.collect()


def test_decoding_happens_in_worker_processes(tree: Path, leak_check: None) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, workers="processes", decode_concurrency=2)
    stages = {s["name"]: s for s in pipe.describe()}
    assert stages["decode"]["runs_on"] == "processes"
    assert stages["claim"]["runs_on"] == "threads"
    assert [s["kind"] for s in pipe.describe()][-1] == "assemble"
    assert pipe.describe()[-1]["batch_size"] == 4
    assert sum(len(y) for _, y in pipe) == 18
    decode = next(s for s in pipe.stats().stages if s.name == "decode")
    assert decode.items_out > 0
    del pipe
    gc.collect()


def test_auto_picks_processes_here_and_says_so(tree: Path, leak_check: None) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    pipe = image.folder(tree, batch_size=4, size=16)
    assert sum(len(y) for _, y in pipe) == 18
    notes = " ".join(pipe.stats().notes)
    assert "processes (workers='auto')" in notes
    one = image.folder(tree, batch_size=4, size=16, decode_concurrency=1)
    assert sum(len(y) for _, y in one) == 18
    assert "threads (workers='auto')" in " ".join(one.stats().notes)
    del pipe, one
    gc.collect()


def test_bad_files_are_counted_and_named_under_max_failures(tree: Path, leak_check: None) -> None:
    (tree / "cat" / "cut.jpg").write_bytes(jpeg(96, 72)[:400])
    (tree / "dog" / "text.jpg").write_bytes(b"not a picture at all")
    pipe = image.folder(tree, batch_size=4, size=16, workers="processes", max_failures=2)
    assert sum(len(y) for _, y in pipe) == 18
    failures = pipe.stats().failures
    assert sorted(Path(f.item.split("'")[1]).name for f in failures) == ["cut.jpg", "text.jpg"]
    assert {f.error_type for f in failures} == {"DecodeError"}
    strict = image.folder(tree, batch_size=4, size=16, workers="processes")
    with pytest.raises(PipelineError) as info:
        list(strict)
    assert isinstance(info.value.exceptions[0], DecodeError)
    del pipe, strict
    gc.collect()


def test_break_and_garbage_collection_leave_no_worker_or_segment(
    tree: Path, leak_check: None
) -> None:
    pipe = image.folder(tree, batch_size=2, size=16, workers="processes", decode_concurrency=2)
    for _ in pipe:
        break
    mine = f"asyncflow-{os.getpid()}-"
    assert any(n.startswith(mine) for n in os.listdir(SHM_DIR))  # persistent: still there
    del pipe
    gc.collect()  # the pipeline's workers and slabs go with it (leak_check holds that)


def test_bad_workers_argument(tree: Path) -> None:
    with pytest.raises(ConfigError, match="workers must be"):
        image.folder(tree, batch_size=2, size=16, workers="gpu")
    pipe = image.folder(tree, batch_size=2, size=16, workers=Processes(start_method="spawn"),
                        decode_concurrency=1)
    assert sum(len(y) for _, y in pipe) == 18
    del pipe
    gc.collect()


_SCRIPT = """
import sys
from asyncflow import image
print("started", flush=True)
{body}
"""
_BODY = """
pipe = image.folder(sys.argv[1], batch_size=4, size=16, decode_concurrency=2)
print(sum(len(y) for _, y in pipe), "|".join(pipe.stats().notes))
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_script_decodes_on_processes_with_or_without_a_main_guard(
    tree: Path, tmp_path: Path, guarded: bool
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    body = _BODY
    if guarded:
        body = 'if __name__ == "__main__":\n' + textwrap.indent(_BODY, "    ")
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(body=body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script), str(tree)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines.count("started") == 1  # no worker imported the script again
    results = [line for line in lines if line != "started"]
    assert len(results) == 1
    count, notes = results[0].split(" ", 1)
    assert count == "18"
    assert "processes (workers='auto')" in notes


def test_stats_count_images_and_hide_claim_and_rows(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, workers="processes", decode_concurrency=2)
    assert sum(len(y) for _, y in pipe) == 18
    stats = pipe.stats()
    described = [(s["name"], s["kind"]) for s in pipe.describe()]
    assert [(s.name, s.kind) for s in stats.stages] == described
    for name in ("claim", "decode", "rows"):
        assert (stats[name].items_in, stats[name].items_out) == (18, 18), name
    assert [s.name for s in stats.stages if s.internal] == ["claim", "rows"]
    assert [s.name for s in stats.user_stages] == ["source", "decode", "batch"]
    # a user's stage, or the consumer (a loaded machine can make it the slowest): never a
    # hidden one
    assert stats.bottleneck in ("source", "decode", "batch", "consumer", None)
