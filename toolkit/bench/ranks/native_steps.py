"""Each engine's training step as its own documentation writes it, built on the objects the
toolkit already set up in this process (the wrapped model, the engine, the strategy), for the
in-process comparison (`toolkit bench step --in-process`, ranks/inprocess_step.py).

The code inside each step is the engine's alone: what toolkit/bench/native/*.py does, minus the
setup. The TensorFlow steps use Keras' own SGD (the native scripts' optimizer), built for the
same variables in the same scope, so the toolkit/native ratio includes the toolkit's
torch-semantics optimizer, as the launch-level comparison does.

A builder returns the step and a function that turns one loader step (a list of numpy
micro-batches) into the step's input, done before timing as a native loop's data pipeline would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[Any], Any]
Builder = Callable[[Any, Any, float, float], tuple[Step, Callable[[list[Any]], Any]]]


def _torch_inputs(micro_batches: list[Any]) -> Any:
    import torch

    return [tuple(torch.as_tensor(array) for array in batch) for batch in micro_batches]


def torch_optimizer_step(run: Any, loss_fn: Any, lr: float, momentum: float) -> tuple[Step, Any]:
    """DDP and Horovod: zero_grad, forward, backward, step (DDP all-reduces in backward,
    Horovod's DistributedOptimizer in step)."""
    model, optimizer = run.backend.model, run.backend.optimizer

    def step(batches: list[tuple[Any, Any]]) -> Any:
        ((inputs, labels),) = batches
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step, _torch_inputs


def deepspeed_step(run: Any, loss_fn: Any, lr: float, momentum: float) -> tuple[Step, Any]:
    """engine(x), engine.backward(loss), engine.step(); the pipeline engine's train_batch."""
    engine = run.backend.engine
    if run.spec.pipeline.stages > 1:
        engine.module.loss_fn = loss_fn

        def pipeline(batches: list[tuple[Any, Any]]) -> Any:
            return engine.train_batch(data_iter=iter(batches))

        return pipeline, _torch_inputs

    def step(batches: list[tuple[Any, Any]]) -> Any:
        ((inputs, labels),) = batches
        loss = loss_fn(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        return loss.detach()

    return step, _torch_inputs


def _tf_inputs(micro_batches: list[Any]) -> Any:
    import tensorflow as tf

    ((inputs, labels),) = micro_batches
    return tf.constant(inputs), tf.constant(labels)


def only_batch_tensors(framework: str, micro_batches: list[Any]) -> tuple[Any, Any]:
    """A loader step's one micro-batch as the framework's tensors (the floor's input, built as
    the native steps build theirs)."""
    if framework == "torch":
        (batch,) = _torch_inputs(micro_batches)
        return batch
    return _tf_inputs(micro_batches)


def mwms_step(run: Any, loss_fn: Any, lr: float, momentum: float) -> tuple[Step, Any]:
    """The custom-training-loop tutorial's step: strategy.run with compute_average_loss over the
    global batch, Keras SGD, the loss reduced with strategy.reduce."""
    import tensorflow as tf

    strategy, model = run.backend.strategy, run.backend.model
    with strategy.scope():
        optimizer = tf.keras.optimizers.SGD(learning_rate=lr, momentum=momentum)
        optimizer.build(model.trainable_variables)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )
    global_batch = run.spec.batch_for(run.world_size).global_

    @tf.function
    def train_step(inputs: Any, labels: Any) -> Any:
        def step_fn(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                per_example = loss_object(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(step_fn, args=(inputs, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return (lambda batch: float(train_step(*batch))), _tf_inputs


def horovod_tf_step(run: Any, loss_fn: Any, lr: float, momentum: float) -> tuple[Step, Any]:
    """Horovod's TF2 guide: DistributedGradientTape (on the variables' tf.Variable, for Keras
    3), Keras SGD."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    model = run.backend.model
    optimizer = tf.keras.optimizers.SGD(learning_rate=lr, momentum=momentum)
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(inputs: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_object(labels, model(inputs, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return (lambda batch: float(train_step(*batch))), _tf_inputs


BUILDERS: dict[tuple[str, str], Builder] = {
    ("ddp", "torch"): torch_optimizer_step,
    ("horovod", "torch"): torch_optimizer_step,
    ("deepspeed", "torch"): deepspeed_step,
    ("tf", "tensorflow"): mwms_step,
    ("horovod", "tensorflow"): horovod_tf_step,
}
