"""Structure and fields of cached items: flatten, unflatten, and the fixed-shape checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from asyncflow import ConfigError
from asyncflow._tree import Tree
from asyncflow.cache._schema import Field, Schema, flatten


def test_flatten_round_trips_nested_structures() -> None:
    item = {"image": np.zeros(3), "meta": (1, [2.5, np.float32(3)]), "label": torch.tensor(4)}
    structure, leaves = flatten(item)
    assert [name for name, _ in leaves] == [
        "item['image']", "item['meta'][0]", "item['meta'][1][0]", "item['meta'][1][1]",
        "item['label']",
    ]
    rebuilt = Tree.from_json(structure).unflatten([v for _, v in leaves])
    assert rebuilt.keys() == item.keys()
    assert isinstance(rebuilt["meta"], tuple) and isinstance(rebuilt["meta"][1], list)


def test_schema_of_a_sample_records_kinds_dtypes_and_shapes() -> None:
    schema = Schema.of((torch.zeros(3, 2, dtype=torch.uint8), np.ones(4, "f4"), 7, 0.5, True,
                        np.int16(3)), batched=False)
    assert [(f.kind, f.dtype, f.shape) for f in schema.fields] == [
        ("tensor", "uint8", (3, 2)), ("ndarray", "float32", (4,)), ("int", "int64", ()),
        ("float", "float64", ()), ("bool", "bool", ()), ("scalar", "int16", ()),
    ]
    assert Field.from_json(dataclasses.asdict(schema.fields[0])) == schema.fields[0]


def test_schema_of_a_batch_drops_the_batch_dimension() -> None:
    schema = Schema.of((torch.zeros(8, 3, 4, 4), torch.arange(8)), batched=True)
    assert [f.shape for f in schema.fields] == [(3, 4, 4), ()]
    arrays, rows = schema.arrays((torch.zeros(5, 3, 4, 4), torch.arange(5)), batched=True,
                                 index=1)
    assert rows == 5 and arrays[0].shape == (5, 3, 4, 4)


@pytest.mark.parametrize("value", ["a path", b"bytes", None, object()])
def test_unsupported_leaves_raise_config_error_naming_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"item\[1\]"):
        Schema.of((np.zeros(2), value), batched=False)


def test_numbers_in_a_batch_need_a_batch_dimension() -> None:
    with pytest.raises(ConfigError, match="batch"):
        Schema.of((torch.zeros(2, 3), 5), batched=True)
    with pytest.raises(ConfigError, match="no batch dimension"):
        Schema.of((torch.zeros(2, 3), torch.tensor(1)), batched=True)


def test_bfloat16_and_object_arrays_are_refused() -> None:
    with pytest.raises(ConfigError, match="bfloat16"):
        Schema.of(torch.zeros(2, dtype=torch.bfloat16), batched=False)
    with pytest.raises(ConfigError, match="object"):
        Schema.of(np.array([None, 1], dtype=object), batched=False)


def test_structured_arrays_are_refused_naming_the_field() -> None:
    # str() of a record dtype is not a name numpy reads back: the filling epoch failed with a
    # bare TypeError ('data type ... not understood') that named no field
    record = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    with pytest.raises(ConfigError, match=r"item\['x'\] has dtype .*structured"):
        Schema.of({"x": record, "y": 1}, batched=False)
    with pytest.raises(ConfigError, match=r"item has dtype .*structured"):
        Schema.of(record[None], batched=True)
    with pytest.raises(ConfigError, match=r"item\[0\] has dtype .*structured"):
        Schema.of((record[0],), batched=False)  # one record: a numpy scalar


def test_variable_shape_names_the_field_and_suggests_a_resize() -> None:
    schema = Schema.of({"image": np.zeros((3, 224, 224), np.uint8), "label": 1}, batched=False)
    with pytest.raises(ConfigError) as err:
        schema.arrays({"image": np.zeros((3, 200, 300), np.uint8), "label": 2}, batched=False,
                      index=17)
    text = str(err.value)
    assert "item['image']" in text and "(3, 200, 300)" in text and "item 17" in text
    assert "resize" in text.lower()


def test_dtype_structure_and_batch_size_changes_are_refused() -> None:
    schema = Schema.of((np.zeros((4, 2), "f4"), np.zeros(4, "i8")), batched=True)
    with pytest.raises(ConfigError, match="dtype"):
        schema.arrays((np.zeros((4, 2), "f8"), np.zeros(4, "i8")), batched=True, index=1)
    with pytest.raises(ConfigError, match="structure"):
        schema.arrays([np.zeros((4, 2), "f4"), np.zeros(4, "i8")], batched=True, index=1)
    with pytest.raises(ConfigError, match="same batch size"):
        schema.arrays((np.zeros((4, 2), "f4"), np.zeros(3, "i8")), batched=True, index=1)


def test_dict_keys_must_be_strings() -> None:
    with pytest.raises(ConfigError, match="string dict keys"):
        Schema.of({1: np.zeros(2)}, batched=False)
