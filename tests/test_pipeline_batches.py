"""Pure logic: what DeepSpeed's pipeline engine is given, and what it refuses before any stage
runs (the module checks structures only; DeepSpeed itself is not imported)."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import ToolkitError

torch = pytest.importorskip("torch")
from toolkit.backends.deepspeed import pipeline  # noqa: E402

X = np.ones((4, 3), dtype=np.float32)
Y = np.arange(4)


def test_tensors_and_flat_tuples_pass_with_only_the_inputs_cast() -> None:
    inputs, labels = pipeline.pipeline_batch((X, Y), 2, torch.bfloat16)
    assert inputs.dtype == torch.bfloat16 and labels.dtype == torch.int64
    inputs, labels = pipeline.pipeline_batch([[X, Y], [Y, Y]], 2, torch.float32)
    assert isinstance(inputs, tuple) and isinstance(labels, tuple) and len(inputs) == 2
    assert pipeline.pipeline_batch((X, Y.astype(np.float32)), 2, torch.bfloat16)[1].dtype == (
        torch.float32
    )


@pytest.mark.parametrize(
    ("batch", "why"),
    [
        ({"x": X, "y": Y}, r"takes \(inputs, labels\) micro-batches, got a mapping"),
        ((X, Y, Y), r"takes \(inputs, labels\) micro-batches, got a tuple of 3"),
        (({"ids": X}, Y), "takes inputs as a tensor or a flat tuple of tensors, got a mapping"),
        (((X, (X, X)), Y), "takes inputs as a tensor or a flat tuple"),
        ((X, None), "takes labels as a tensor or a flat tuple of tensors, got a leaf"),
    ],
    ids=["dict", "triple", "dict-inputs", "nested-inputs", "no-labels"],
)
def test_anything_else_is_one_clear_error(batch: object, why: str) -> None:
    with pytest.raises(ToolkitError, match=r"the pipeline engine \(parallel.pipeline=2\) " + why):
        pipeline.pipeline_batch(batch, 2, torch.float32)


def test_the_pipeline_needs_a_loss_fn() -> None:
    with pytest.raises(ToolkitError, match="computes the loss on its last stage"):
        pipeline.require_loss_fn(None, 2)
