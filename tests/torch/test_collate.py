"""Collate: torch's default_collate as the default, padding for variable-length fields, and
torch's tensor collate stacking into asyncflow's segments in a worker process."""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import numpy as np
import pytest
import torch

from asyncflow import ConfigError
from asyncflow.torch import Padded, _collate, default_collate, pad_collate
from asyncflow.workers import _segments


def test_default_collate_is_torchs() -> None:
    assert default_collate is torch.utils.data.default_collate


def test_pads_dict_fields_and_reports_lengths_and_mask() -> None:
    batch = [
        {"tokens": torch.tensor([1, 2, 3]), "label": 0, "name": "a"},
        {"tokens": torch.tensor([4]), "label": 1, "name": "b"},
        {"tokens": torch.tensor([5, 6]), "label": 2, "name": "c"},
    ]
    out = pad_collate(batch, pad_value=-1, mask=True)
    assert out["tokens"].tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
    assert out["tokens"].dtype == torch.int64
    assert out["tokens_lengths"].tolist() == [3, 1, 2]
    assert out["tokens_mask"].tolist() == [
        [True, True, True], [True, False, False], [True, True, False]
    ]
    assert out["label"].tolist() == [0, 1, 2]
    assert out["name"] == ["a", "b", "c"]
    assert "tokens_mask" not in pad_collate(batch)


def test_pads_boxes_along_the_first_dimension_only() -> None:
    boxes = [np.zeros((2, 4), np.float32), np.ones((0, 4), np.float32), np.ones((3, 4), np.float32)]
    out = pad_collate([{"boxes": b} for b in boxes])
    assert out["boxes"].shape == (3, 3, 4)
    assert out["boxes"].dtype == torch.float32
    assert out["boxes_lengths"].tolist() == [2, 0, 3]
    assert out["boxes"][1].sum() == 0 and out["boxes"][2].sum() == 12
    with pytest.raises(ValueError, match="first dimension"):
        pad_collate([{"boxes": np.zeros((2, 4))}, {"boxes": np.zeros((2, 5))}])


def test_named_fields_pad_lists_and_leave_the_rest_to_default_collate() -> None:
    batch = [
        {"ids": [1, 2], "image": torch.zeros(3, 2, 2)},
        {"ids": [3], "image": torch.ones(3, 2, 2)},
    ]
    out = pad_collate(batch, fields=["ids"], multiple_of=4)
    assert out["ids"].tolist() == [[1, 2, 0, 0], [3, 0, 0, 0]]
    assert out["image"].shape == (2, 3, 2, 2)
    assert set(out) == {"ids", "ids_lengths", "image"}


def test_tuple_and_namedtuple_samples_give_padded_fields() -> None:
    class Sample(NamedTuple):
        seq: torch.Tensor
        y: int

    out = pad_collate([Sample(torch.ones(2), 1), Sample(torch.ones(1), 0)], mask=True)
    assert isinstance(out, Sample)
    assert isinstance(out.seq, Padded)
    assert out.seq.values.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert out.seq.lengths.tolist() == [2, 1]
    assert out.seq.mask.tolist() == [[True, True], [True, False]]
    assert out.y.tolist() == [1, 0]
    plain = pad_collate([(torch.ones(2), 1), (torch.ones(3), 0)])
    assert isinstance(plain, list) and plain[0].values.shape == (2, 3)


def test_bare_tensor_samples_give_one_padded() -> None:
    out = pad_collate([torch.arange(3), torch.arange(1)])
    assert isinstance(out, Padded)
    assert out.values.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert out.mask is None
    assert pad_collate([1, 2]).tolist() == [1, 2]


def test_samples_of_mixed_dtypes_pad_to_their_common_dtype_as_default_collate_stacks() -> None:
    # an int sample first used to make the batch int64: 0.5 became 0, silently
    out = pad_collate([{"x": np.array([1, 2])}, {"x": np.array([0.5])}])
    assert out["x"].dtype == torch.float64
    assert out["x"].tolist() == [[1.0, 2.0], [0.5, 0.0]]
    same = pad_collate([np.array([1, 2]), np.array([0.5, 1.5])])
    assert torch.equal(same.values, default_collate([np.array([1, 2]), np.array([0.5, 1.5])]))


def test_works_as_a_dataloader_collate_fn() -> None:
    data = [{"x": torch.arange(n)} for n in (1, 4, 2, 3)]
    collate = functools.partial(pad_collate, mask=True)
    batches = list(torch.utils.data.DataLoader(data, batch_size=2, collate_fn=collate))
    assert [b["x"].shape for b in batches] == [(2, 4), (2, 3)]


def test_rejects_overwriting_and_bad_options() -> None:
    with pytest.raises(ValueError, match="overwrite"):
        pad_collate([{"x": torch.ones(1), "x_lengths": 1}])
    with pytest.raises(ConfigError):
        pad_collate([{"x": torch.ones(1)}], multiple_of=0)
    with pytest.raises(TypeError, match="'x'"):
        pad_collate([{"x": object()}], fields=["x"])


# -- in a DataLoader's worker process: torch's tensor collate into asyncflow's segments ------



@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.bool, torch.int64,
                                   torch.float16, torch.complex64])
def test_tensor_collate_stacks_into_a_segment_of_the_worker(
    dtype: torch.dtype, as_worker: None
) -> None:
    samples = [(torch.arange(3 * 128 * 128) % 7 + i).reshape(3, 128, 128).to(dtype)
               for i in range(4)]
    out = _collate._collate_tensor(samples)
    assert out.dtype == dtype and torch.equal(out, torch.stack(samples))
    (path, size, _), = _segments._made.values()  # the batch is the whole segment
    assert out.data_ptr() in _segments._made and size == out.nbytes
    assert os.path.exists(path)


def test_tensor_collate_leaves_what_it_cannot_stack_in_a_segment_to_torch(
    as_worker: None
) -> None:
    small = [torch.ones(4), torch.zeros(4)]  # below SHM_THRESHOLD
    assert torch.equal(_collate._collate_tensor(small), torch.stack(small))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        _collate._collate_tensor([torch.zeros(128, 128), torch.zeros(128, 64)])
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        _collate._collate_tensor([torch.zeros(128, 128), torch.zeros(64, 256)])
    assert _segments._made == {}


def test_tensor_collate_outside_a_worker_process_is_torchs() -> None:
    samples = [torch.full((128, 128), float(i)) for i in range(3)]
    assert torch.equal(_collate._collate_tensor(samples), torch.stack(samples))
    assert _segments._made == {}
