"""The parity report's held-out scores: the numpy forward pass is the torch model's function."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolkit.datasets import digits
from toolkit.parity import torch_models
from toolkit.parity.architectures import forward, held_out_scores, initial_weights, inputs_for


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_the_numpy_forward_is_the_torch_models(arch: str) -> None:
    weights, x = initial_weights(arch, 3), digits().x_test
    expected = torch_models.build(arch, weights)(torch.from_numpy(inputs_for(arch, x, "torch")))
    np.testing.assert_allclose(forward(arch, weights, x), expected.detach().numpy(), atol=1e-5)


def test_untrained_weights_score_about_chance() -> None:
    loss, accuracy = held_out_scores("mlp", initial_weights("mlp", 3))
    assert abs(loss - np.log(10)) < 0.1
    assert 0.0 <= accuracy < 0.2
