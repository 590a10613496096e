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
    modules: tuple[tuple[str, str, int], ...] = ()
    """Each module's dotted name, class name and input elements for one sample, leaves
    included (empty = unknown): what activation checkpointing keeps of a recomputed module."""
    saved: tuple[tuple[str, int], ...] = ()
    """What autograd saved for backward in the probe's forward pass, once per storage and
    parameters left out: (the innermost module running, fp32 elements) per tensor."""
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
        """What backward keeps for one sample (fp32 elements): the tensors autograd saved in
        the probe's forward pass, or, where none were seen, the input and every leaf's output."""
        return self.kept_per_sample(())

    def kept_per_sample(self, recomputed: Sequence[str]) -> int | None:
        """What backward keeps for one sample when the modules of the classes `recomputed` are
        checkpointed: of each outermost such module only its input, plus, while backward
        recomputes one, what the largest one saves; everything else as before."""
        if not self.layer_activations:
            return None
        names = [name for name, _ in self.named_layers]
        if len(names) != len(self.layer_activations):  # facts given without the layers' names
            names = [""] * len(self.layer_activations)
        held = list(self.saved) or list(zip(names, self.layer_activations, strict=True))
        base = 0 if self.saved else self.input_elements
        blocks = _outermost(
            [(name, size) for name, kind, size in self.modules if kind in recomputed]
        )
        inside = [
            sum(size for name, size in held if name == block or name.startswith(f"{block}."))
            for block, _ in blocks
        ]
        kept = base + sum(size for _, size in held) - sum(inside) + sum(size for _, size in blocks)
        return kept + max(inside, default=0)


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
    return walk(model, input_shape, f"--model {target}")


def walk(model: Any, input_shape: Sequence[int] | None, source: str) -> ModelFacts:
    """The facts of a built torch model; a model that starts with an embedding is probed
    with token ids (zeros), any other with a zero sample."""
    named = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    leaves = [m for _, m in named]
    layer_parameters = tuple(
        sum(p.numel() for p in leaf.parameters(recurse=False)) for leaf in leaves
    )
    total = sum(p.numel() for p in model.parameters())
    shape = tuple(input_shape) if input_shape else _input_shape(leaves)
    activations: tuple[int, ...] = ()
    inputs: dict[str, int] = {}
    saved: tuple[tuple[str, int], ...] = ()
    if shape:
        activations, inputs, saved = _probe(model, leaves, shape)
    return ModelFacts(
        parameters=total,
        largest_layer=max(layer_parameters, default=total) or total,
        layer_parameters=layer_parameters,
        layer_activations=activations,
        input_elements=_product(shape) if shape else 0,
        named_layers=tuple(
            (name, count) for (name, _), count in zip(named, layer_parameters, strict=True)
        ),
        modules=tuple(
            (name, type(m).__name__, inputs[name])
            for name, m in model.named_modules()
            if name in inputs
        ),
        saved=saved,
        own_tensor_plan=dict(getattr(model, "_tp_plan", None) or {}),
        source=source,
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


def _probe(
    model: Any, leaves: list[Any], shape: tuple[int, ...]
) -> tuple[tuple[int, ...], dict[str, int], tuple[tuple[str, int], ...]]:
    """One forward pass of one sample, gradients on: each leaf's output elements, each
    module's input elements (its first tensor argument) by dotted name, and what autograd
    saves for backward (`ModelFacts.saved`)."""
    import torch

    sizes: dict[int, int] = {}
    inputs: dict[str, int] = {}
    running: list[str] = [""]
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: set[int] = set()
    saved: list[tuple[str, int]] = []

    def output_hook(module: Any, _: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            sizes[id(module)] = sizes.get(id(module), 0) + output.numel()

    def enter(name: str) -> Any:
        def record(_: Any, args: Any) -> None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and name not in inputs:
                inputs[name] = first.numel()
            running.append(name)

        return record

    def leave(*_: Any) -> None:
        running.pop()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in parameters and key not in storages:
            storages.add(key)
            saved.append((running[-1], -(-storage.nbytes() // 4)))
        return tensor

    handles = [leaf.register_forward_hook(output_hook) for leaf in leaves]
    for name, m in model.named_modules():
        if name:
            handles += [m.register_forward_pre_hook(enter(name)), m.register_forward_hook(leave)]
    tokens = bool(leaves) and isinstance(leaves[0], torch.nn.Embedding)
    sample = torch.zeros((1, *shape), dtype=torch.long if tokens else torch.float32)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(sample)
    except Exception as error:  # the user's model refused the probe input
        raise ToolkitError(
            f"--model: a forward pass of one sample of shape {list(shape)} failed: {error}",
            "give the per-sample input shape with --input-shape, e.g. 3,32,32",
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    return tuple(sizes.get(id(leaf), 0) for leaf in leaves), inputs, tuple(saved)


def _outermost(blocks: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (name, size) entries not inside another entry's module."""
    names = [name for name, _ in blocks]
    return [
        (name, size)
        for name, size in blocks
        if not any(name.startswith(f"{other}.") for other in names if other != name)
    ]
