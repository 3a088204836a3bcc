"""The public surface of asyncflow.torch."""

from __future__ import annotations

import subprocess
import sys

import asyncflow
import asyncflow.torch


def test_all_is_sorted_and_complete() -> None:
    names = asyncflow.torch.__all__
    assert names == sorted(names)
    assert all(not n.startswith("_") and hasattr(asyncflow.torch, n) for n in names)


def test_top_level_names_are_the_torch_packages() -> None:
    assert asyncflow.DataLoader is asyncflow.torch.DataLoader
    assert asyncflow.mix.__module__ == "asyncflow.sources._mix"


def test_import_asyncflow_does_not_import_torch() -> None:
    code = "import sys, asyncflow; asyncflow.Pipeline; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
