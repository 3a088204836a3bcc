"""torch's randperm without torch: the same permutation from the same seed."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from asyncflow.sources._randperm import torch_randperm


@pytest.mark.parametrize("without_torch", [False, True])
def test_it_is_torchs_permutation(without_torch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = {}
    for seed in (0, 1, 42, -3, 2**32 + 7, 2**63 - 1):
        for n in (0, 1, 2, 3, 10, 257, 5000):
            generator = torch.Generator()
            generator.manual_seed(seed & 0xFFFFFFFF)
            expected[seed, n] = torch.randperm(n, generator=generator).numpy()
    if without_torch:
        monkeypatch.setitem(sys.modules, "torch", None)  # as where torch is not imported
    for (seed, n), order in expected.items():
        got = torch_randperm(n, seed)
        assert got.dtype == np.int64
        assert np.array_equal(got, order), (seed, n)
