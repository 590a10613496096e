"""The physical floor's two parts, for the floor scripts (floor_torch.py, floor_tf.py) and for
the floor variant of `toolkit bench step --in-process` (ranks/inprocess_step.py) alike.

- compute: the bench's MLP, forward, backward and SGD with momentum on one rank's samples, in
  plain PyTorch or plain TensorFlow, with no engine and no communication;
- move: the rank's gradient bytes copied once, single-threaded, between two buffers already in
  memory. With 2 ranks over shared memory an all-reduce must at least bring each rank its
  peer's share of the sum, about the gradient bytes once; one copy is the cheapest way to move
  them.

Imported by package path (`toolkit.bench.native._floor_parts`) from both sides: the floor
scripts run as files, but with the toolkit installed, as `_floor.py` needs it anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

Compute = Callable[[Any], Any]


class GradientMove:
    """A single-threaded copy of `parameters` float32 values between two buffers, both touched
    first so that no page fault is timed."""

    def __init__(self, parameters: int) -> None:
        self.source = np.ones(parameters, dtype=np.float32)
        self.target = np.zeros(parameters, dtype=np.float32)
        self.seconds: list[float] = []

    def __call__(self) -> None:
        start = time.perf_counter()
        np.copyto(self.target, self.source)
        self.seconds.append(time.perf_counter() - start)


class FloorStep:
    """A framework's compute step, timed apart from the gradient move that follows it."""

    def __init__(self, compute: Compute, parameters: int) -> None:
        self.compute = compute
        self.move = GradientMove(parameters)
        self.compute_seconds: list[float] = []

    def __call__(self, batch: Any) -> Any:
        start = time.perf_counter()
        loss = self.compute(batch)
        self.compute_seconds.append(time.perf_counter() - start)
        self.move()
        return loss


def torch_compute(dims: list[int], lr: float, momentum: float) -> tuple[Compute, int]:
    """A plain PyTorch step on one (inputs, labels) batch of tensors, and the parameter count."""
    import torch

    from toolkit.bench.native._torch_model import mlp

    model = mlp(dims)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = torch.nn.CrossEntropyLoss()

    def compute(batch: tuple[Any, Any]) -> Any:
        inputs, labels = batch
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return compute, sum(p.numel() for p in model.parameters())


def tf_compute(dims: list[int], lr: float, momentum: float) -> tuple[Compute, int]:
    """A compiled plain TensorFlow step on one (inputs, labels) batch of tensors, and the
    parameter count. The update is the cheapest TensorFlow has, one fused kernel per weight
    (the toolkit's TorchSGD, toolkit.backends.tf.optimizers), not Keras' SGD, whose several
    element-wise passes would raise the floor."""
    import tensorflow as tf

    from toolkit.backends.tf.optimizers import TorchSGD
    from toolkit.bench.native._keras_model import mlp

    model = mlp(dims)
    optimizer = TorchSGD(learning_rate=lr, momentum=momentum, weight_decay=0.0, nesterov=False)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_object(labels, model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def compute(batch: tuple[Any, Any]) -> Any:
        return train_step(*batch).numpy()  # .numpy(): the step has finished before the move

    return compute, sum(int(tf.size(v)) for v in model.trainable_variables)


COMPUTE = {"torch": torch_compute, "tensorflow": tf_compute}
"""The floor's compute step by framework name (TrainSpec.framework_name)."""
