"""Batches of any structure, handled without knowing their layout. No engine imports.

A batch is a tree: tuples (named tuples keep their type), lists and mappings (dicts, and
mapping types such as Hugging Face's `BatchEncoding`, rebuilt as plain dicts) are containers;
everything else (numpy arrays, tensors, numbers, strings, None) is a leaf. The backends move and
cast a batch by mapping a function over its leaves, so a tensor, an `(inputs, targets)` pair, a
dict of `input_ids` and `attention_mask`, or any nesting of them trains alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from toolkit.errors import ToolkitError


def is_container(tree: Any) -> bool:
    return isinstance(tree, tuple | list | Mapping)


def map_leaves(fn: Callable[..., Any], tree: Any, *others: Any) -> Any:
    """`fn` applied to every leaf of `tree` (and the matching leaves of `others`), same shape.

    With several trees, they must have one structure; a difference is a ToolkitError that names
    where, e.g. `[0]['input_ids']`.
    """
    return _map(fn, tree, others, "")


def _map(fn: Callable[..., Any], tree: Any, others: tuple[Any, ...], path: str) -> Any:
    for other in others:
        _check_same_node(tree, other, path)
    if isinstance(tree, Mapping):
        items = {
            key: _map(fn, value, tuple(o[key] for o in others), f"{path}[{key!r}]")
            for key, value in tree.items()
        }
        return OrderedDict(items) if isinstance(tree, OrderedDict) else items
    if isinstance(tree, tuple | list):
        mapped = [
            _map(fn, value, tuple(o[index] for o in others), f"{path}[{index}]")
            for index, value in enumerate(tree)
        ]
        if isinstance(tree, list):
            return mapped
        if hasattr(tree, "_fields"):  # a named tuple
            return type(tree)(*mapped)
        return tuple(mapped)
    return fn(tree, *others)


def _check_same_node(tree: Any, other: Any, path: str) -> None:
    where = path or "the top level"
    if isinstance(tree, Mapping):
        if not isinstance(other, Mapping) or set(tree) != set(other):
            raise ToolkitError(
                f"batches differ in structure at {where}: {describe(tree)} and {describe(other)}",
                "give every micro-batch the same keys, nesting and order",
            )
    elif isinstance(tree, tuple | list):
        if not isinstance(other, tuple | list) or len(tree) != len(other):
            raise ToolkitError(
                f"batches differ in structure at {where}: {describe(tree)} and {describe(other)}",
                "give every micro-batch the same keys, nesting and order",
            )
    elif is_container(other):
        raise ToolkitError(
            f"batches differ in structure at {where}: {describe(tree)} and {describe(other)}",
            "give every micro-batch the same keys, nesting and order",
        )


def describe(node: Any) -> str:
    if isinstance(node, Mapping):
        return f"a mapping with keys {sorted(map(str, node))}"
    if isinstance(node, tuple | list):
        return f"a {type(node).__name__} of {len(node)}"
    return f"a leaf ({type(node).__name__})"


def leaves(tree: Any) -> list[Any]:
    """Every leaf, depth first, in the containers' own order."""
    found: list[Any] = []
    map_leaves(found.append, tree)
    return found


def batch_size(tree: Any) -> int:
    """The number of samples in a batch: the leading dimension of its first array leaf."""
    for leaf in leaves(tree):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    raise ToolkitError(
        f"cannot tell how many samples this batch holds: no leaf is an array ({describe(tree)})",
        "make at least one leaf of each batch an array or tensor with the samples along axis 0",
    )
