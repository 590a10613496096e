"""The torch engines' restore of a checkpoint into a module, in one process: every entry of its
state_dict, 0-d buffers included (BatchNorm's num_batches_tracked)."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.backends import torch_state
from toolkit.backends.torch_common import numpy_state
from toolkit.checkpoint import CheckpointState


def test_a_model_with_batchnorm_restores_its_0d_counter_and_statistics() -> None:
    torch.manual_seed(0)
    trained = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    trained(torch.randn(8, 3))  # moves the running statistics and counts one batch
    saved = numpy_state(trained)
    assert saved["1.num_batches_tracked"].shape == ()
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    torch_state.restore_module(fresh, CheckpointState(step=1, model=saved))
    restored = numpy_state(fresh)
    assert restored.keys() == saved.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value)
    assert int(fresh[1].num_batches_tracked) == 1
