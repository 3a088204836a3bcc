"""torch's CPU ``randperm``, with or without torch: the permutation that
``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` gives.

torch's CPU generator is a Mersenne Twister (MT19937) seeded with the low 32 bits of the seed
(``init_genrand``); ``randperm`` swaps ``r[i]`` with ``r[i + random() % (n - i)]`` for each
``i`` below ``n - 1``, or, from ``2**32 // 20`` items on, runs the inside-out shuffle on
64-bit draws (two 32-bit outputs, the first one high). NumPy's MT19937 gives the same 32-bit
outputs from the same state, so the draws are vectorized and only the swaps are a Python loop
(2-3 s a million items on a busy 2-core machine). Where torch is already imported it draws the
permutation itself (0.05 s a million), as it does for the large ones wherever it is installed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["torch_randperm"]

# From this many items on, torch's randperm draws 64 bits per index (the inside-out shuffle).
_LARGE = (2**32 - 1) // 20


def torch_randperm(n: int, seed: int) -> npt.NDArray[np.int64]:
    """``torch.randperm(n)`` from a CPU generator given ``manual_seed(seed)``, as int64.

    Args:
        n: The permutation's length (``>= 0``).
        seed: The generator's seed (any int; torch keeps its low 32 bits).
    """
    torch = sys.modules.get("torch")
    if torch is None and n >= _LARGE:  # torch's own draws, where it is installed at all
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None and hasattr(torch, "randperm"):
        generator = torch.Generator()
        generator.manual_seed(seed & 0xFFFFFFFF)
        order: npt.NDArray[np.int64] = torch.randperm(n, generator=generator).numpy()
        return order
    if n < 2:
        return np.arange(n, dtype=np.int64)
    # NumPy's legacy seeding of an int is MT19937's init_genrand, as torch's manual_seed.
    state: Any = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)
    bits = np.random.MT19937()
    bits.state = state
    if n < _LARGE:
        return _swapped(n, bits.random_raw(n - 1))
    return _inside_out(n, bits.random_raw(2 * n))


def _swapped(n: int, raw: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    offsets = (raw % np.arange(n, 1, -1, dtype=np.uint64)).tolist()
    order = list(range(n))
    for i, offset in enumerate(offsets):
        j = i + offset
        order[i], order[j] = order[j], order[i]
    return np.array(order, dtype=np.int64)


def _inside_out(n: int, raw: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    wide = ((raw[0::2] << np.uint64(32)) | raw[1::2]) % np.arange(1, n + 1, dtype=np.uint64)
    order = np.empty(n, dtype=np.int64)
    for i, z in enumerate(wide.tolist()):
        order[i] = order[z]
        order[z] = i
    return order
