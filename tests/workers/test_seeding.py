"""One seeding module: every stream fixed by its (seed, epoch[, item]) key, with the numbers
each caller gave before the module existed (orders, crops and checkpoints stay reproducible)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from asyncflow.pipeline import seeding


def test_the_numbers_are_pinned_across_versions() -> None:
    # Computed by the recipes each caller had before (sources/_orders.py, torch/_shuffle.py,
    # workers/_worker_options.py, image/_geometry.py, pipeline/_stages.py): changing one reshuffles
    # every user's resumed epoch.
    assert seeding.epoch_seed(7, 3) == 1529793891446696395
    assert seeding.item_seed(7, 3, 11) == 1738497228507368661
    assert seeding.item_random(7, 3, 11).getrandbits(32) == 3709819890
    assert seeding.epoch_rng(7, 3).integers(0, 1000, 5).tolist() == [727, 975, 538, 884, 347]
    assert seeding.epoch_random(7, 3).getrandbits(32) == 3325856070


def test_epoch_rng_is_numpys_generator_for_the_pair() -> None:
    ours = seeding.epoch_rng(2**63 + 5, 4).permutation(100)
    assert (ours == np.random.default_rng([2**63 + 5, 4]).permutation(100)).all()


@pytest.mark.parametrize(
    "derive",
    [
        lambda s: seeding.epoch_rng(s, 1).integers(0, 2**32, 4).tolist(),
        lambda s: seeding.epoch_seed(s, 1),
        lambda s: seeding.item_seed(s, 1, 2),
        lambda s: seeding.item_random(s, 1, 2).random(),
    ],
    ids=["epoch_rng", "epoch_seed", "item_seed", "item_random"],
)
def test_a_seed_is_taken_modulo_2_to_the_64(derive: Callable[[int], object]) -> None:
    assert derive(-1) == derive(2**64 - 1)
    assert derive(3) == derive(3 + 2**64)
    assert derive(3) != derive(4)


def test_every_part_of_the_key_changes_the_stream() -> None:
    base = seeding.item_seed(1, 2, 3)
    assert len({base, seeding.item_seed(2, 2, 3), seeding.item_seed(1, 3, 3),
                seeding.item_seed(1, 2, 4)}) == 4
    assert len({seeding.epoch_seed(0, e) for e in range(1000)}) == 1000


def test_seeds_fit_an_int64() -> None:
    drawn = [seeding.fresh_seed() for _ in range(200)]
    drawn += [seeding.item_seed(s, 0, 0) for s in range(200)]
    drawn += [seeding.epoch_seed(s, 0) for s in range(200)]
    assert all(0 <= s < 2**63 for s in drawn)
    assert len(set(drawn[:200])) == 200


def test_an_items_stream_does_not_depend_on_the_order_items_are_drawn() -> None:
    forward = [seeding.item_random(5, 0, i).random() for i in range(50)]
    backward = [seeding.item_random(5, 0, i).random() for i in reversed(range(50))]
    assert forward == backward[::-1]


def test_seed_everything_seeds_the_global_generators() -> None:
    state = random.getstate(), np.random.get_state()
    try:
        seeding.seed_everything(seeding.item_seed(9, 0, 1))
        first = random.random(), np.random.random()
        seeding.seed_everything(seeding.item_seed(9, 0, 1))
        assert (random.random(), np.random.random()) == first
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def test_the_module_imports_neither_numpy_nor_torch() -> None:
    code = (
        "import sys; import asyncflow.pipeline.seeding as s; s.item_seed(1, 2, 3);"
        "s.item_random(1, 2, 3); s.epoch_seed(1, 2);"
        "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
