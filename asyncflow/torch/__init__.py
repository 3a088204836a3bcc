"""PyTorch integration: collate, pinned staging, device transfer, the DataLoader facade.

Importing this package imports torch; ``import asyncflow`` loads it only when one of its names
(``asyncflow.DataLoader``) is first used.
"""

from __future__ import annotations

from . import _reducers  # noqa: F401  (registers the tensor reducer for worker processes)
from ._collate import Padded, default_collate, pad_collate
from ._distributed import EvenSteps, StepStats, even_steps, gather_states, worker_states
from ._loader import DataLoader
from ._pinned import PinnedPool, PoolStats
from ._transfer import to_device

__all__ = [
    "DataLoader",
    "EvenSteps",
    "Padded",
    "PinnedPool",
    "PoolStats",
    "StepStats",
    "default_collate",
    "even_steps",
    "gather_states",
    "pad_collate",
    "to_device",
    "worker_states",
]
