"""``examples/quickstart.ipynb`` in a real IPython kernel, as a user runs it.

nbclient executes every cell in a kernel started from this interpreter (a kernel spec written
into a temporary ``JUPYTER_PATH`` points at ``sys.executable``, so the kernel sees the same
environment as the tests). Then, in the same kernel, the test re-runs cells and interrupts one,
as a user would.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
KERNEL = "asyncflow-tests"
EXPECTED_TOTAL = sum(i * i for i in range(200))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _write_kernel_spec(root: Path) -> None:
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "asyncflow tests",
        "language": "python",
    }))


def _text(cell: Any) -> str:
    """Everything a cell printed or displayed, as plain text (HTML included)."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.extend(str(v) for k, v in out["data"].items() if k.startswith("text/"))
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "\n".join(parts)


def _html(cell: Any) -> str:
    return "\n".join(
        out["data"]["text/html"]
        for out in cell.get("outputs", [])
        if out["output_type"] in ("execute_result", "display_data") and "text/html" in out["data"]
    )


def _errors(cell: Any) -> list[str]:
    return [
        f"{out['ename']}: {out['evalue']}"
        for out in cell.get("outputs", [])
        if out["output_type"] == "error"
    ]


def _cell_with(nb: Any, text: str) -> int:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and text in cell.source:
            return i
    raise AssertionError(f"no code cell contains {text!r}")


class _Kernel:
    """Runs cells of one notebook, and extra ones, in one kernel."""

    def __init__(self, client: Any, nb: Any) -> None:
        self.client = client
        self.nb = nb

    async def run(self, index: int) -> Any:
        cell = self.nb.cells[index]
        await self.client.async_execute_cell(cell, index)
        return cell

    async def run_code(self, source: str, *, tags: tuple[str, ...] = ()) -> Any:
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})
        self.nb.cells.append(cell)
        return await self.run(len(self.nb.cells) - 1)

    async def value(self, expression: str) -> str:
        cell = await self.run_code(f"print(repr({expression}))")
        return _text(cell).strip()


@pytest.fixture
async def kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[_Kernel]:
    _write_kernel_spec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name=KERNEL,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    async with client.async_setup_kernel():
        yield _Kernel(client, nb)


async def test_quickstart_notebook(kernel: _Kernel) -> None:
    nb = kernel.nb
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for i in code:
        cell = await kernel.run(i)
        assert not _errors(cell), f"cell {i} failed: {_errors(cell)}\n{cell.source}"

    # The pipeline renders as HTML: its stages and their settings.
    first = nb.cells[_cell_with(nb, "Pipeline(range(200))")]
    html = _html(first)
    assert "<table" in html and "fetch" in html and "square" in html and "runs_on=loop" in html

    # Top-level `async for` and plain `for` both ran, in the kernel's running loop.
    assert f"async for: {EXPECTED_TOTAL}" in _text(nb.cells[_cell_with(nb, "async for batch")])
    assert f"for: {EXPECTED_TOTAL}" in _text(nb.cells[_cell_with(nb, "for batch in pipe:")])

    # The stats table: per-stage rows, the bottleneck highlighted.
    stats = _html(nb.cells[_cell_with(nb, "pipe.stats()")])
    assert "items/s" in stats and "asyncflow-bottleneck" in stats and "bottleneck:" in stats

    # The progress bar reached its total, and the live table was shown beside it.
    progress = nb.cells[_cell_with(nb, "pipe.progress(")]
    assert "10/10" in _text(progress)
    assert "<table" in _html(progress)

    # image.folder made batches of the requested shape.
    images = nb.cells[_cell_with(nb, "image.folder(")]
    assert "(torch.Size([16, 3, 128, 128]), torch.float32, torch.Size([16]))" in _text(images)
    assert "decode" in _html(images)

    # The profiler's report: every setting, a recommendation.
    report = _html(nb.cells[_cell_with(nb, "asyncflow.profile(")])
    for column in ("c=1 items/s", "c=4 items/s", "c=16 items/s", "recommended"):
        assert column in report
    assert "concurrency=16" in _text(nb.cells[_cell_with(nb, "report.apply(")])


async def test_rerunning_cells_adds_no_threads(kernel: _Kernel) -> None:
    nb = kernel.nb
    setup = _cell_with(nb, "Pipeline(range(200))")
    loop_cell, sync_cell = _cell_with(nb, "async for batch"), _cell_with(nb, "for batch in pipe:")
    await kernel.run(setup)
    await kernel.run(loop_cell)
    await kernel.run(sync_cell)
    await kernel.run_code("import threading, time")
    before = int(await kernel.value("threading.active_count()"))
    for _ in range(10):
        for index in (loop_cell, sync_cell):
            cell = await kernel.run(index)
            assert f"{EXPECTED_TOTAL}" in _text(cell)
    after = int(await kernel.value("threading.active_count()"))
    assert after <= before, await kernel.value("[t.name for t in threading.enumerate()]")


_FOREVER = """
import itertools, threading, time
from asyncflow import Pipeline

produced = 0

def forever():
    global produced
    for i in itertools.count():
        produced += 1
        yield i

def slow(x):
    time.sleep(0.005)
    return x

baseline = threading.active_count()
print("started", flush=True)
"""


async def _interrupt(kernel: _Kernel, loop_source: str) -> None:
    await kernel.run_code(_FOREVER)
    running = asyncio.ensure_future(kernel.run_code(loop_source, tags=("raises-exception",)))
    # Let the pipeline get going, then press the stop button.
    await asyncio.sleep(3.0)
    assert not running.done(), _text(await running)
    await kernel.client.km.interrupt_kernel()
    cell = await asyncio.wait_for(running, 30)
    # A sync loop gets KeyboardInterrupt; ipykernel cancels an async cell's task instead.
    stopped = ("KeyboardInterrupt", "CancelledError")
    assert any(e.startswith(stopped) for e in _errors(cell)), _text(cell)

    check = await kernel.run_code(
        "time.sleep(0.5)\n"
        "seen = produced\n"
        "time.sleep(1.0)\n"
        "print('grew', produced - seen)\n"
        "print('threads', threading.active_count() - baseline)\n"
        "print('names', [t.name for t in threading.enumerate()])"
    )
    text = _text(check)
    assert re.search(r"^grew 0$", text, flags=re.M), text
    extra = int(re.search(r"^threads (-?\d+)$", text, flags=re.M).group(1))  # type: ignore[union-attr]
    assert extra <= 0, text


async def test_interrupting_a_for_loop_stops_the_pipeline(kernel: _Kernel) -> None:
    await _interrupt(kernel, "for item in Pipeline(forever).map(slow, concurrency=2):\n    pass")


async def test_interrupting_an_async_for_loop_stops_the_pipeline(kernel: _Kernel) -> None:
    await _interrupt(
        kernel, "async for item in Pipeline(forever).map(slow, concurrency=2):\n    pass"
    )


_CELL_DATASET = """
import os, threading
import torch, asyncflow
from asyncflow import Pipeline

class Squares(torch.utils.data.Dataset):   # defined in a cell: pickled by value
    def __len__(self):
        return 64
    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return i * i, (info.id if info else -1), os.getpid()

loader = asyncflow.DataLoader(Squares(), batch_size=8, num_workers=2, workers="processes",
                              collate_fn=lambda items: items)
got = [x for batch in loader for x in batch]
print("total", sum(v for v, _, _ in got))
print("workers", sorted({w for _, w, _ in got}), len({p for *_, p in got} - {os.getpid()}))
cube = lambda x: x ** 3
print("cubes", sum(Pipeline(range(10)).map(cube, concurrency=2, workers="processes")))
"""


async def test_a_dataset_defined_in_a_cell_loads_on_processes(kernel: _Kernel) -> None:
    if len(__import__("os").sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    await kernel.run_code("import threading, multiprocessing")
    before = int(await kernel.value("threading.active_count()"))
    for _ in range(3):  # re-running the cell starts no thread or process that outlives it
        cell = await kernel.run_code(_CELL_DATASET)
        text = _text(cell)
        assert not _errors(cell), text
        assert f"total {sum(i * i for i in range(64))}" in text
        assert "workers [0, 1] 2" in text
        assert f"cubes {sum(i ** 3 for i in range(10))}" in text
    await kernel.run_code("del loader; import gc; gc.collect(); import time; time.sleep(1)")
    after = int(await kernel.value("threading.active_count()"))
    assert after <= before, await kernel.value("[t.name for t in threading.enumerate()]")
    children = await kernel.value(
        "[p.name() for p in __import__('psutil').Process().children(recursive=True)"
        " if not any(s in ' '.join(p.cmdline()) for s in ('forkserver', 'resource_tracker'))]"
    )
    assert children == "[]", children
