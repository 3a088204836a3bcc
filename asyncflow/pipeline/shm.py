"""The shared-memory names features may use: where segments live, the size from which
arrays travel through them, and how a feature names and sweeps segments of its own
(``image.folder`` writes decoded rows into slabs), teaches worker processes to send a type
through them, or makes a worker's result in one from the start (``allocate``). The mechanisms
themselves are ``asyncflow.workers``' (its ``_segments.py`` and ``_reducers.py``)."""

from __future__ import annotations

from ..workers import (
    SHM_DIR,
    SHM_THRESHOLD,
    allocate,
    register_lazy_reducers,
    register_reducer,
    segment_prefix,
    sweep,
)

__all__ = [
    "SHM_DIR",
    "SHM_THRESHOLD",
    "allocate",
    "register_lazy_reducers",
    "register_reducer",
    "segment_prefix",
    "sweep",
]
