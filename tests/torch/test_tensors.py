"""Taking batches apart into tensors and rebuilding them."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch

from asyncflow.torch._tensors import flatten


class Pair(NamedTuple):
    a: torch.Tensor
    b: object


def test_round_trip_keeps_types_order_and_non_tensors() -> None:
    arr = np.arange(3)
    batch = {
        "x": torch.zeros(2),
        "nested": [torch.ones(1), (torch.full((1,), 2.0), "label", 3)],
        "pair": Pair(torch.full((1,), 4.0), None),
        "od": OrderedDict(y=torch.full((1,), 5.0)),
        "array": arr,
    }
    leaves, rebuild = flatten(batch)
    assert [float(t.sum()) for t in leaves] == [0.0, 1.0, 2.0, 4.0, 5.0]
    again = rebuild([t + 10 for t in leaves])
    assert again["x"].tolist() == [10.0, 10.0]
    assert isinstance(again["nested"], list) and isinstance(again["nested"][1], tuple)
    assert again["nested"][1][1:] == ("label", 3)
    assert isinstance(again["pair"], Pair) and again["pair"].b is None
    assert isinstance(again["od"], OrderedDict) and again["od"]["y"].item() == 15.0
    assert again["array"] is arr


def test_a_bare_tensor_and_a_plain_value() -> None:
    leaves, rebuild = flatten(torch.ones(2))
    assert len(leaves) == 1 and rebuild([torch.zeros(2)]).tolist() == [0.0, 0.0]
    leaves, rebuild = flatten("text")
    assert leaves == [] and rebuild([]) == "text"
