"""What the plan needs to know about a model: parameters, the largest layer, activations.

From `--params N` only the count is known: the largest layer (ZeRO-3's working set) is then
taken as the whole model, an upper bound, and activations are unknown. From
`--model module:factory` the torch model is built and walked: every leaf module's own
parameters, and, with one forward pass of a single sample under forward hooks, every leaf's
output size, which is the activation memory kept for backward to first order.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from toolkit.errors import ToolkitError


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    parameters: int
    largest_layer: int
    """Parameters of the largest leaf module (ZeRO-3 gathers one such layer at a time)."""
    largest_layer_known: bool = True
    layer_parameters: tuple[int, ...] = ()
    """Each leaf module's parameters, in forward order (empty when unknown)."""
    layer_activations: tuple[int, ...] = ()
    """Each leaf module's output elements for one sample, in forward order (empty = unknown)."""
    input_elements: int = 0
    """Elements of one input sample (0 = unknown)."""
    named_layers: tuple[tuple[str, int], ...] = ()
    """Each leaf module's dotted name and own parameters (empty when unknown)."""
    own_tensor_plan: Mapping[str, str] = field(default_factory=dict)
    """The model's own tensor-parallel plan (a Hugging Face model's `_tp_plan`)."""
    source: str = ""

    def planned_parameters(self, tensor_plan: Mapping[str, str]) -> int:
        """Parameters of the layers a tensor-parallel plan splits (the spec's, else the
        model's own): the leaves its patterns name, or that lie inside a module they name;
        0 when the layers are unknown."""
        patterns = list(tensor_plan or self.own_tensor_plan)
        return sum(
            count
            for name, count in self.named_layers
            if any(fnmatchcase(name, p) or fnmatchcase(name, f"{p}.*") for p in patterns)
        )

    @property
    def first_layer(self) -> int | None:
        """Parameters of the first leaf that has any, in forward order (None when unknown)."""
        return next((n for n in self.layer_parameters if n > 0), None)

    @property
    def activations_per_sample(self) -> int | None:
        if not self.layer_activations:
            return None
        return self.input_elements + sum(self.layer_activations)


def from_params(parameters: int, largest_layer: int | None = None) -> ModelFacts:
    if parameters < 1:
        raise ToolkitError(f"--params={parameters}: must be at least 1", "give the model's size")
    if largest_layer is not None and not 1 <= largest_layer <= parameters:
        raise ToolkitError(
            f"--largest-layer={largest_layer}: must be between 1 and --params ({parameters})",
            "give the parameter count of the model's largest layer",
        )
    return ModelFacts(
        parameters=parameters,
        largest_layer=largest_layer or parameters,
        largest_layer_known=largest_layer is not None,
        source=f"--params {parameters}",
    )


def load_factory(target: str) -> Any:
    """The callable "module:function" names; a clear error when it cannot be found."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise ToolkitError(
            f"--model={target!r}: expected module:factory", "e.g. --model mypkg.models:build"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ToolkitError(
            f"--model={target!r}: cannot import {module_name!r} ({error})",
            "run from the directory that holds it, or set PYTHONPATH",
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ToolkitError(
            f"--model={target!r}: {module_name} has no callable {name!r}",
            "name a function that returns the model",
        )
    return factory


def from_factory(target: str, input_shape: Sequence[int] | None = None) -> ModelFacts:
    """Build the torch model `target` names and walk it (see the module docs)."""
    import torch

    model = load_factory(target)()
    if not isinstance(model, torch.nn.Module):
        raise ToolkitError(
            f"--model={target!r} returned {type(model).__name__}, not a torch.nn.Module",
            "plan a Keras model with --params N (its model.count_params())",
        )
    named = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    leaves = [m for _, m in named]
    layer_parameters = tuple(
        sum(p.numel() for p in leaf.parameters(recurse=False)) for leaf in leaves
    )
    total = sum(p.numel() for p in model.parameters())
    shape = tuple(input_shape) if input_shape else _input_shape(leaves)
    activations: tuple[int, ...] = ()
    if shape:
        activations = _leaf_outputs(model, leaves, shape)
    return ModelFacts(
        parameters=total,
        largest_layer=max(layer_parameters, default=total) or total,
        layer_parameters=layer_parameters,
        layer_activations=activations,
        input_elements=_product(shape) if shape else 0,
        named_layers=tuple(
            (name, count) for (name, _), count in zip(named, layer_parameters, strict=True)
        ),
        own_tensor_plan=dict(getattr(model, "_tp_plan", None) or {}),
        source=f"--model {target}",
    )


def _product(shape: Sequence[int]) -> int:
    result = 1
    for size in shape:
        result *= size
    return result


def _input_shape(leaves: list[Any]) -> tuple[int, ...]:
    """A sample's shape when the first layer says it (a Linear's in_features), else ()."""
    first = leaves[0] if leaves else None
    in_features = getattr(first, "in_features", None)
    return (int(in_features),) if isinstance(in_features, int) else ()


def _leaf_outputs(model: Any, leaves: list[Any], shape: tuple[int, ...]) -> tuple[int, ...]:
    import torch

    sizes: dict[int, int] = {}

    def hook(module: Any, _: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            sizes[id(module)] = sizes.get(id(module), 0) + output.numel()

    handles = [leaf.register_forward_hook(hook) for leaf in leaves]
    try:
        with torch.no_grad():
            model(torch.zeros((1, *shape)))
    except Exception as error:  # the user's model refused the probe input
        raise ToolkitError(
            f"--model: a forward pass of one sample of shape {list(shape)} failed: {error}",
            "give the per-sample input shape with --input-shape, e.g. 3,32,32",
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    return tuple(sizes.get(id(leaf), 0) for leaf in leaves)
