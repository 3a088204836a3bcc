"""An in-memory map-style Dataset for ``bench_loader_memory.py``: one large uint8 array.

Its own module, so that worker processes of every start method can import it by reference.
"""

from __future__ import annotations

import numpy as np
import torch


class ArrayRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``mib`` MiB of random bytes in 1 KiB rows; item ``i`` is a row as float32."""

    def __init__(self, mib: int) -> None:
        rng = np.random.default_rng(0)
        self.data = rng.integers(0, 255, (mib * 1024, 1024), dtype=np.uint8)

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.data[(i * 97) % len(self.data)]
        return torch.from_numpy(row.astype(np.float32)), i
