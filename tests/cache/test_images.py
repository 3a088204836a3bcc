"""``image.folder(...).cache(path)``: the issue's own example, on a small folder of JPEGs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import image


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "train"
    for c in range(3):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(7):
            pixels = rng.integers(0, 255, (40 + 3 * i, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.jpg", quality=90)
    return root


def test_fill_then_replay_equals_the_decode_pipeline(folder: Path, tmp_path: Path) -> None:
    def plain() -> Any:
        return image.folder(folder, batch_size=4, size=32, normalize=False, seed=0)

    pipe = plain().cache(tmp_path / "cache" / "train-32")
    expected = list(plain())
    for _ in range(2):  # the filling epoch, then a replay
        got = list(pipe)
        assert len(got) == len(expected) == 6
        for (a, la), (b, lb) in zip(got, expected, strict=True):
            assert a.dtype == torch.uint8 and a.shape[1:] == (3, 32, 32)
            assert torch.equal(a, b) and torch.equal(la, lb)
    info = pipe.info()  # type: ignore[attr-defined]
    assert info.usable and info.count == 21 and info.batch_size == 4
    shuffled = [label for _, labels in pipe.shuffle(seed=1) for label in labels.tolist()]
    assert sorted(shuffled) == sorted(label for _, labels in expected for label in labels.tolist())


def test_another_size_rebuilds_and_says_so(folder: Path, tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "cache"
    list(image.folder(folder, batch_size=4, size=32, normalize=False, seed=0).cache(path))
    caplog.set_level(logging.INFO, "asyncflow.cache")
    again = image.folder(folder, batch_size=4, size=24, normalize=False, seed=0).cache(path)
    assert next(iter(again))[0].shape[1:] == (3, 24, 24)
    assert "upstream pipeline changed" in caplog.text and "size" in caplog.text


def test_an_unseeded_evaluation_folder_has_the_same_fingerprint_in_every_process(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from PIL import Image

    from tests.doubles import ROOT, child_env

    root = tmp_path / "data"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (40 + i, 30), (i * 40, 10, 200)).save(root / cls / f"{i}.jpg")
    code = (
        "import json, sys\n"
        "from asyncflow import image\n"
        "from asyncflow.cache._cached import _description\n"
        f"pipe = image.folder({str(root)!r}, batch_size=2, size=16)\n"
        "print(json.dumps(_description(pipe), sort_keys=True, default=str))\n"
    )
    prints = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env(), cwd=ROOT, check=True).stdout.strip()
        for _ in range(2)
    }
    assert len(prints) == 1, prints
    assert json.loads(prints.pop())


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_epochs_run_before_the_cache_do_not_change_its_fingerprint(
    folder: Path, tmp_path: Path, caplog: Any, workers: str
) -> None:
    """Issue 25, point 16: the fingerprint describes the data, not the upstream's past runs
    (its listing's epochs, its assembler's stalls or a journal's log)."""
    pipe = image.folder(folder, batch_size=4, size=32, normalize=False, seed=0,
                        workers=workers, decode_concurrency=2)
    list(pipe.journal(tmp_path / "journal"))  # a run, and a journal's log on the assembler
    caplog.set_level(logging.INFO, "asyncflow.cache")
    filled = list(pipe.cache(tmp_path / "c"))
    list(pipe)  # another run of the upstream
    replayed = list(pipe.cache(tmp_path / "c"))
    assert "written" in caplog.text
    assert "cannot be used" not in caplog.text and "rebuilding" not in caplog.text
    for (a, la), (b, lb) in zip(filled, replayed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
