"""Activation checkpointing from the spec (toolkit.backends.torch_recompute): the named modules
run their forward again in the backward pass, keep fewer tensors, and give the same gradients;
the spec refuses it where no engine does it. The engines' runs are parity cases
(`toolkit parity --cases recompute`)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from toolkit.backends.torch_recompute import recompute
from toolkit.errors import ToolkitError
from toolkit.spec import SpecError, TrainSpec


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 4),
    )


class LinearCalls:
    """Counts the calls of every Linear layer's forward (installed before recompute wraps it,
    so a recomputation counts too)."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.count = 0
        for layer in net.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.forward = self._counted(layer.forward)  # type: ignore[method-assign]

    def _counted(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return forward(*args, **kwargs)

        return counted


def saved_and_gradients(net: torch.nn.Module, x: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    """Tensors kept for the backward pass of one step, and the gradients."""
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = net(x).square().mean()
    loss.backward()
    return saved, [p.grad.clone() for p in net.parameters() if p.grad is not None]


def test_recomputed_layers_run_again_keep_less_and_give_the_same_gradients() -> None:
    x = torch.randn(32, 8)
    plain, recomputed = model(), model()
    plain_calls, recomputed_calls = LinearCalls(plain), LinearCalls(recomputed)
    recompute(recomputed, ["Linear"])
    plain_saved, plain_grads = saved_and_gradients(plain, x)
    saved, grads = saved_and_gradients(recomputed, x)
    assert plain_calls.count == 3 and recomputed_calls.count == 6  # again in the backward pass
    assert saved < plain_saved
    for mine, theirs in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_without_gradients_nothing_is_recomputed() -> None:
    net = model()
    recompute(net, ["Linear"])
    with torch.no_grad():
        assert net(torch.randn(2, 8)).shape == (2, 4)


def test_a_module_inside_a_recomputed_one_is_not_wrapped_again() -> None:
    net = torch.nn.Sequential(model())
    inner = copy.copy(net[0][0].forward)
    recompute(net, ["Sequential", "Linear"])
    assert net[0][0].forward == inner


def test_a_class_the_model_lacks_is_refused_listing_its_classes() -> None:
    with pytest.raises(ToolkitError, match=r"activation_checkpointing\.modules names \['Block'\]"):
        recompute(model(), ["Block"])


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"backend": "tf", "activation_checkpointing": {"modules": ["Dense"]}}, "modules"),
        (
            {
                "backend": "deepspeed",
                "parallel": {"pipeline": 2},
                "activation_checkpointing": {"modules": ["Linear"]},
            },
            "modules",
        ),
        ({"backend": "ddp", "activation_checkpointing": {"cpu_checkpointing": True}}, "cpu"),
    ],
)
def test_the_spec_refuses_it_where_no_engine_does_it(data: dict, path: str) -> None:
    with pytest.raises(SpecError, match=rf"activation_checkpointing\.{path}"):
        TrainSpec.from_dict({"batch": {"global": 8}, **data})


@pytest.mark.multiproc
def test_the_plan_and_a_measured_run_agree_on_what_recomputation_saves(tmp_path: Path) -> None:
    """scripts/bench_recompute.py on the GPT example: the saving torch's allocations show
    when every GPT2Block is recomputed is the one `toolkit plan` predicts, within 10% at this
    small shape (fixed costs such as the logits weigh more here than at the reported one)."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_recompute.py"
    shape = ["--width", "128", "--layers", "4", "--micro", "16", "--out", str(tmp_path)]
    subprocess.run([sys.executable, str(script), *shape], check=True, capture_output=True)
    result = json.loads((tmp_path / "recompute.json").read_text())
    measured, planned = result["measured_saving_bytes"], result["planned_saving_bytes"]
    assert measured > 0.5 * result["measured_step_peak_bytes"]["kept"]
    assert abs(planned - measured) <= 0.10 * measured, result
