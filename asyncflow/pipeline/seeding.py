"""Every random stream in asyncflow, derived from ``(seed, epoch[, item])`` in one place:
the public path of ``asyncflow.workers``' seeding (its ``_seeding.py`` draws the table of
streams and who uses each). The streams live below the engine because worker processes draw
their per-item seeds (:func:`item_seed`, :func:`seed_everything`) without the engine."""

from ..workers import (
    SEED_MASK,
    KeyedIterator,
    epoch_random,
    epoch_rng,
    epoch_seed,
    fresh_seed,
    item_random,
    item_seed,
    seed_everything,
)

__all__ = [
    "SEED_MASK",
    "KeyedIterator",
    "epoch_random",
    "epoch_rng",
    "epoch_seed",
    "fresh_seed",
    "item_random",
    "item_seed",
    "seed_everything",
]
