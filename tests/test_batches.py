"""Pure logic: batches of any structure are mapped leaf by leaf, their structure kept."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy as np
import pytest

from toolkit.backends.batches import batch_size, leaves, map_leaves
from toolkit.errors import ToolkitError

Pair = namedtuple("Pair", ["inputs", "targets"])


def test_every_container_keeps_its_type_and_leaves_are_mapped() -> None:
    tree = {
        "ids": np.arange(3),
        "nested": (np.ones(2), [np.zeros(1), 5]),
        "pair": Pair(np.ones(1), np.zeros(1)),
        "ordered": OrderedDict(b=1, a=2),
        "none": None,
    }
    mapped = map_leaves(lambda leaf: ("leaf", type(leaf).__name__), tree)
    assert mapped["ids"] == ("leaf", "ndarray")
    assert isinstance(mapped["nested"], tuple) and isinstance(mapped["nested"][1], list)
    assert mapped["nested"][1][1] == ("leaf", "int")
    assert isinstance(mapped["pair"], Pair) and mapped["pair"].targets == ("leaf", "ndarray")
    assert isinstance(mapped["ordered"], OrderedDict) and list(mapped["ordered"]) == ["b", "a"]
    assert mapped["none"] == ("leaf", "NoneType")


def test_a_single_array_is_a_leaf() -> None:
    assert map_leaves(lambda a: a * 2, np.array([1, 2])).tolist() == [2, 4]


def test_several_trees_are_zipped_leaf_by_leaf() -> None:
    first = {"x": np.array([1.0]), "y": (np.array([2]),)}
    second = {"y": (np.array([20]),), "x": np.array([10.0])}
    stacked = map_leaves(lambda *xs: np.stack(xs), first, second)
    assert stacked["x"].tolist() == [[1.0], [10.0]]
    assert stacked["y"][0].tolist() == [[2], [20]]


@pytest.mark.parametrize(
    ("other", "where"),
    [
        ({"x": np.ones(1)}, "the top level"),
        ({"x": np.ones(1), "y": [np.ones(1), np.ones(1)]}, "['y']"),
        ({"x": (np.ones(1),), "y": (np.ones(1),)}, "['x']"),
    ],
)
def test_a_different_structure_is_an_error_that_says_where(other: dict, where: str) -> None:
    tree = {"x": np.ones(1), "y": (np.ones(1),)}
    with pytest.raises(ToolkitError, match=f"differ in structure at {where}".replace("[", r"\[")):
        map_leaves(lambda *xs: xs, tree, other)


def test_leaves_and_batch_size() -> None:
    tree = {"meta": 3, "x": np.zeros((5, 2)), "y": np.zeros(5)}
    assert len(leaves(tree)) == 3
    assert batch_size(tree) == 5
    with pytest.raises(ToolkitError, match="no leaf is an array"):
        batch_size({"a": 1})
