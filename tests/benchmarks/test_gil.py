"""measure_gil (benchmarks/_gil.py): the GIL-held share orders functions by how they scale on
threads.

Only orderings are asserted (with a wide gap), never absolute timings: these tests run on
loaded machines with few cores. There a thread that wants a core can wait for one with the
GIL free, which lowers a pure-Python reading now and then, so an ordering gets three tries.
"""

from __future__ import annotations

import ast
import io
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncflow import ConfigError
from benchmarks import _gil
from benchmarks._gil import GilProfile, measure_gil

DATA = Path(__file__).resolve().parents[2] / "asyncflow" / "_data"


def _python_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _assert_holds_less_than_python(fn: Callable[[Any], Any], items: list[Any]) -> None:
    tries = []
    for _ in range(3):
        python = measure_gil(_python_loop, [20_000], min_seconds=0.2)
        other = measure_gil(fn, items, min_seconds=0.2)
        if python.held_share > other.held_share + 0.5:
            return
        tries.append((python, other))
    pytest.fail(f"pure Python did not hold the GIL far more: {tries}")


def test_pure_python_holds_the_gil_far_more_than_sleep() -> None:
    _assert_holds_less_than_python(_sleep, [0.002])


def test_zlib_releases_the_gil() -> None:
    _assert_holds_less_than_python(zlib.compress, [bytes(range(256)) * 4096])  # 1 MiB


def test_pil_decode_holds_the_gil_less_than_python() -> None:
    from PIL import Image

    blobs = [p.read_bytes() for p in sorted(DATA.glob("*.jpg"))]
    assert blobs

    def decode(blob: bytes) -> None:
        with Image.open(io.BytesIO(blob)) as im:
            im.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)

    _assert_holds_less_than_python(decode, blobs)


def test_profile_fields() -> None:
    profile = measure_gil(_sleep, [0.001, 0.002], min_seconds=0.05, max_seconds=1.0)
    assert isinstance(profile, GilProfile)
    assert profile.items >= 2  # every item once, at least
    assert 0.0 <= profile.held_share <= 1.0
    assert profile.seconds_per_item >= 0.001
    assert profile.max_thread_speedup >= 1.0
    assert GilProfile(0.001, 0.0, 1).max_thread_speedup == float("inf")
    assert GilProfile(0.001, 0.25, 1).max_thread_speedup == 4.0


def test_stops_starting_calls_after_max_seconds() -> None:
    start = time.perf_counter()
    profile = measure_gil(_sleep, [0.05], min_seconds=0.0, max_seconds=0.1)
    assert profile.items <= 4
    assert time.perf_counter() - start < 5  # generous: the baseline and warm-up come first


def test_restores_the_switch_interval_and_stops_the_probe() -> None:
    before = sys.getswitchinterval()
    threads = set(threading.enumerate())
    measure_gil(_sleep, [0.001], min_seconds=0.01)
    assert sys.getswitchinterval() == before
    assert set(threading.enumerate()) == threads


def test_an_error_from_fn_propagates_and_restores_everything() -> None:
    before = sys.getswitchinterval()
    threads = set(threading.enumerate())

    def boom(_: object) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        measure_gil(boom, [1])
    assert sys.getswitchinterval() == before
    assert set(threading.enumerate()) == threads


@pytest.mark.parametrize(
    ("items", "kwargs"),
    [([], {}), ([1], {"min_seconds": -1.0}), ([1], {"min_seconds": 2.0, "max_seconds": 1.0})],
)
def test_config_errors(items: list[int], kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        measure_gil(_sleep, items, **kwargs)


def test_held_share_subtracts_the_probes_own_lateness() -> None:
    # 10% of wake-ups are late without load: 10% late under load means nothing was held.
    assert _gil._held_share([0.0] * 90 + [1.0] * 10, 0.5, 0.1) == pytest.approx(0.0)
    assert _gil._held_share([1.0] * 100, 0.5, 0.1) == pytest.approx(1.0)
    assert _gil._held_share([0.0] * 45 + [1.0] * 55, 0.5, 0.1) == pytest.approx(0.5)
    assert _gil._held_share([], 0.5, 0.1) == 0.0


def test_the_probe_imports_only_the_stdlib_and_asyncflows_errors() -> None:
    tree = ast.parse(Path(_gil.__file__).read_text())
    imported = {
        (node.level, node.module or "") if isinstance(node, ast.ImportFrom) else (0, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    for level, name in imported:
        assert not level, name
        root = name.split(".")[0]
        assert root in sys.stdlib_module_names or name in ("__future__", "asyncflow"), name
