"""``workers="auto"``'s choice (``asyncflow/workers/_auto.py``): a stage that needs worker
processes for its meaning (torch's ``worker_init_fn``, ``get_worker_info()``) skips the
core-count rules, never the safety checks."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from asyncflow.workers import _auto
from asyncflow.workers._segments import SHM_DIR

NEEDED = "the dataset asks torch's get_worker_info()"


def double(x: int) -> int:
    return 2 * x


def test_a_needed_stage_takes_processes_on_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_auto, "usable_cpus", lambda: 1)
    chosen, why = _auto.choose_workers(double, 1, stage="fetch", needed=NEEDED)
    assert chosen is not None and why == f"processes (workers='auto'): {NEEDED}"
    unneeded, why = _auto.choose_workers(double, 1, stage="fetch")
    assert unneeded is None and "gain nothing" in why


def test_a_needed_stage_in_a_daemonic_process_gets_threads_and_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_auto.multiprocessing, "current_process",
                        lambda: SimpleNamespace(daemon=True))
    chosen, why = _auto.choose_workers(double, 4, stage="fetch", needed=NEEDED)
    assert chosen is None
    assert why == ("threads (workers='auto'): this is already a worker process (daemonic "
                   "processes cannot have children)")


def test_a_needed_stage_without_writable_shared_memory_gets_threads_and_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = os.access

    def access(path: Any, mode: int) -> bool:
        return False if str(path) == str(SHM_DIR) else real(path, mode)

    monkeypatch.setattr(_auto.os, "access", access)
    chosen, why = _auto.choose_workers(double, 4, stage="fetch", needed=NEEDED)
    assert chosen is None
    assert why == f"threads (workers='auto'): shared memory ({SHM_DIR}) is not writable"


def test_a_needed_stage_whose_function_does_not_pickle_gets_threads_naming_the_stage() -> None:
    lock = threading.Lock()  # a worker process cannot receive it
    chosen, why = _auto.choose_workers(lambda x: (lock, x), 4, stage="fetch", needed=NEEDED)
    assert chosen is None and why.startswith("threads (workers='auto'): ") and "fetch" in why
