"""The one structure walker: leaves in a fixed order, containers rebuilt with their types, the
cache manifest's JSON form unchanged."""

from __future__ import annotations

import json
from collections import OrderedDict
from types import MappingProxyType
from typing import Any, NamedTuple

import pytest

from asyncflow import ConfigError
from asyncflow._tree import Tree, flatten


class Pair(NamedTuple):
    a: Any
    b: Any


class Tagged(list):  # type: ignore[type-arg]
    pass


def test_leaves_come_depth_first_and_mappings_in_key_order() -> None:
    tree, leaves = flatten({"z": 1, "a": [2, (3, 4)], "m": {"k": 5}})
    assert leaves == [1, 2, 3, 4, 5]
    assert tree.names("item") == [
        "item['z']", "item['a'][0]", "item['a'][1][0]", "item['a'][1][1]", "item['m']['k']",
    ]


def test_containers_keep_their_types_and_constants_are_carried_through() -> None:
    value = {"pair": Pair(1.0, "label"), "od": OrderedDict(y=2.0), "tagged": Tagged([3.0]),
             "proxy": MappingProxyType({"p": 4.0}), "none": None}
    tree, leaves = flatten(value, is_leaf=lambda v: isinstance(v, float))
    assert leaves == [1.0, 2.0, 3.0, 4.0]
    again = tree.unflatten([x * 10 for x in leaves])
    assert isinstance(again["pair"], Pair) and again["pair"] == (10.0, "label")
    assert isinstance(again["od"], OrderedDict) and again["od"] == {"y": 20.0}
    assert isinstance(again["tagged"], Tagged) and again["tagged"] == [30.0]
    assert again["proxy"]["p"] == 40.0 and again["none"] is None


def test_a_bare_leaf_and_a_bare_constant() -> None:
    tree, leaves = flatten(7)
    assert leaves == [7] and tree.unflatten([8]) == 8 and tree.names("x") == ["x"]
    tree, leaves = flatten("text", is_leaf=lambda v: False)
    assert leaves == [] and tree.unflatten([]) == "text"


def test_the_json_form_is_the_cache_manifests() -> None:
    tree, _ = flatten({"image": 0, "meta": (1, [2, 3])})
    node = tree.to_json()
    assert node == {"dict": [["image", {"field": 0}],
                             ["meta", {"tuple": [{"field": 1}, {"list": [{"field": 2},
                                                                          {"field": 3}]}]}]]}
    again = Tree.from_json(json.loads(json.dumps(node))).unflatten(["a", "b", "c", "d"])
    assert again == {"image": "a", "meta": ("b", ["c", "d"])}


def test_json_names_a_non_string_key_and_refuses_constants() -> None:
    with pytest.raises(ConfigError, match=r"item\['a'\] has the key 3"):
        flatten({"a": {3: 1.0}})[0].to_json()
    with pytest.raises(ConfigError, match="JSON cannot describe"):
        flatten((1.0, "x"), is_leaf=lambda v: isinstance(v, float))[0].to_json()


def test_rebuilding_needs_as_many_leaves() -> None:
    tree, _ = flatten([1, 2])
    with pytest.raises(StopIteration):
        tree.unflatten([1])
