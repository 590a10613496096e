"""Torch micro-batches of any structure: converted, cast (floating leaves only), fed to the model
by their structure, and the loss read from whatever the model returns."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from toolkit.errors import ToolkitError

torch = pytest.importorskip("torch")
from toolkit.backends import torch_batches as batches  # noqa: E402


def test_numpy_leaves_become_tensors_and_only_floating_ones_are_cast() -> None:
    batch = {"ids": np.arange(3), "mask": np.ones(3, dtype=bool), "x": (np.ones(2),), "n": 4}
    got = batches.to_torch(batch, torch.bfloat16)
    assert got["ids"].dtype == torch.int64 and got["mask"].dtype == torch.bool
    assert got["x"][0].dtype == torch.bfloat16
    assert got["n"] == 4
    assert batches.to_torch(np.ones(2, dtype=np.float32)).dtype == torch.float32


def test_the_model_is_called_by_the_batch_structure() -> None:
    def model(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return args, kwargs

    assert batches.call_model(model, {"a": 1}) == ((), {"a": 1})
    assert batches.call_model(model, (1, 2)) == ((1, 2), {})
    assert batches.call_model(model, [1]) == ((1,), {})
    assert batches.call_model(model, 7) == ((7,), {})


@pytest.mark.parametrize(
    "outputs",
    [
        torch.tensor(2.0),
        {"loss": torch.tensor(2.0), "logits": None},
        SimpleNamespace(loss=torch.tensor(2.0)),
    ],
    ids=["tensor", "dict", "object"],
)
def test_a_returned_loss_is_found(outputs: Any) -> None:
    assert float(batches.returned_loss(outputs)) == 2.0


def test_a_missing_or_non_scalar_loss_is_a_clear_error() -> None:
    with pytest.raises(ToolkitError, match="needs the model to return its loss"):
        batches.returned_loss(SimpleNamespace(loss=None, logits=torch.ones(1)))
    with pytest.raises(ToolkitError, match=r"loss has shape \(3,\)"):
        batches.returned_loss(torch.ones(3))


def test_loss_from_a_pair_with_loss_fn_and_from_the_model_without() -> None:
    linear = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(linear.weight)
    x, y = np.ones((4, 2), dtype=np.float32), np.zeros((4, 1), dtype=np.float32)
    pair_loss = batches.micro_batch_loss(linear, (x, y), torch.nn.functional.mse_loss)
    assert float(pair_loss.detach()) == 4.0

    def own_loss(features: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(linear(features), target)}

    dict_loss = batches.micro_batch_loss(own_loss, {"features": x, "target": y}, None)
    assert float(dict_loss.detach()) == 4.0
    with pytest.raises(ToolkitError, match=r"needs \(inputs, targets\) micro-batches"):
        batches.micro_batch_loss(linear, {"features": x}, torch.nn.functional.mse_loss)


def test_evaluation_sums_in_eval_mode_without_gradients_and_restores_the_mode() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    seen: list[tuple[bool, bool]] = []

    def metric_fn(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        seen.append((model.training, outputs.requires_grad))
        return {"count": len(targets), "positive": (targets > 0).sum()}

    micro_batches = [(np.ones((3, 2), np.float32), np.array([1, 0, 1]))] * 2
    sums = batches.evaluate_module(model, micro_batches, metric_fn, pairs=True)
    assert sums == {"count": 6.0, "positive": 4.0}
    assert seen == [(False, False), (False, False)]
    assert model.training


def test_one_micro_batchs_share_and_mean_are_its_loss_to_the_bit() -> None:
    """Skipping x / 1 and 0 + x changes nothing: the loss, its gradient and the mean reported
    are the bits the division and the float64 running sum gave."""
    weight = torch.tensor([0.1234567, -7.654321], requires_grad=True)
    loss = (weight * torch.tensor([3.0, 1.0 / 3.0])).sum()
    batches.share_of_step(loss, 1).backward(retain_graph=True)
    skipped = weight.grad.clone()
    weight.grad = None
    (loss / 1).backward()
    assert torch.equal(skipped, weight.grad)
    assert batches.share_of_step(loss, 1) is loss
    assert torch.equal(
        batches.mean_loss([loss.detach()]),
        (torch.zeros((), dtype=torch.float64) + loss.detach().double()) / 1,
    )
    losses = [torch.tensor(0.1), torch.tensor(0.2), torch.tensor(0.7)]
    total = torch.zeros((), dtype=torch.float64)
    for one in losses:
        total += one.double()
    assert torch.equal(batches.mean_loss(losses), total / 3)
    assert torch.equal(batches.share_of_step(losses[2], 3), losses[2] / 3)
