"""Keras optimizers that mean exactly what the spec's optimizer means in PyTorch.

Why not Keras' own: the spec has one meaning for every engine, and PyTorch's is the reference.
Keras differs in ways that move the weights:
- `keras.optimizers.Adam` adds epsilon to sqrt(v) before bias correction ("epsilon hat"), i.e. its
  epsilon equals torch's epsilon × sqrt(1 - beta2^t), which changes with the step.
- Keras' `weight_decay` is always decoupled (AdamW-style), also for SGD and Adam, where torch's
  `weight_decay` is an L2 term added to the gradient.
The update rules below follow torch.optim.SGD (dampening 0), Adam and AdamW line by line.

SGD with momentum (not Nesterov) runs as one fused kernel per weight, TensorFlow's
ResourceApplyMomentum (accum = accum * momentum + grad; var -= lr * accum): the same two
roundings per element, in the same order, as the four element-wise ops and the assign it
replaces, so the weights are bit for bit the same (tests/test_tf_optimizers.py holds it to a
float32 NumPy reference); it reads and writes each weight, slot and gradient once instead of
passing over them five times, which makes the TF engines' step faster than with Keras' SGD
(docs/engine-notes.md, TensorFlow). Nesterov keeps the element-wise form: the fused kernel's
Nesterov update rounds differently from torch's. Adam has no such kernel: TensorFlow's
ResourceApplyAdam is Keras' "epsilon hat" form.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras import ops


class TorchSGD(keras.optimizers.Optimizer):
    """torch.optim.SGD: buf = momentum*buf + g (+ L2); p -= lr * (g + momentum*buf if nesterov
    else buf)."""

    def __init__(
        self,
        *,
        learning_rate: float,
        momentum: float,
        weight_decay: float,
        nesterov: bool,
        name: str = "torch_sgd",
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = momentum
        self.l2 = weight_decay
        self.nesterov = nesterov

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        self.momenta = [self.add_variable_from_reference(v, "momentum") for v in variables]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        lr = ops.cast(learning_rate, variable.dtype)
        grad = ops.cast(gradient, variable.dtype)
        if self.l2:
            grad = grad + self.l2 * variable
        if self.momentum:
            # torch starts the buffer at the first gradient; from zeros, momentum*0 + g is that.
            buffer = self.momenta[self._get_variable_index(variable)]
            if not self.nesterov:
                apply_momentum(variable, buffer, lr, grad, self.momentum)
                return
            self.assign(buffer, self.momentum * buffer + grad)
            grad = grad + self.momentum * buffer  # Nesterov
        self.assign_sub(variable, lr * grad)


def apply_momentum(variable: Any, buffer: Any, lr: Any, grad: Any, momentum: float) -> None:
    """buffer = buffer * momentum + grad; variable -= lr * buffer, in one kernel. The optimizer
    hands `update_step` the tf.Variable behind a Keras weight (or, under tf.distribute, this
    replica's copy), and its own slots as Keras variables: both give their resource handle."""
    tf.raw_ops.ResourceApplyMomentum(
        var=_tf_variable(variable).handle,
        accum=_tf_variable(buffer).handle,
        lr=lr,
        grad=tf.convert_to_tensor(grad),
        momentum=tf.constant(momentum, dtype=lr.dtype),
        use_locking=False,
        use_nesterov=False,
    )


def _tf_variable(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


class TorchAdam(keras.optimizers.Optimizer):
    """torch.optim.Adam (L2 weight decay) or, with `decoupled=True`, torch.optim.AdamW."""

    def __init__(
        self,
        *,
        learning_rate: float,
        beta_1: float,
        beta_2: float,
        epsilon: float,
        weight_decay: float,
        decoupled: bool,
        name: str = "torch_adam",
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.eps = epsilon
        self.decay = weight_decay
        self.decoupled = decoupled

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        self.exp_avgs = [self.add_variable_from_reference(v, "exp_avg") for v in variables]
        self.exp_avg_sqs = [self.add_variable_from_reference(v, "exp_avg_sq") for v in variables]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        lr = ops.cast(learning_rate, variable.dtype)
        grad = ops.cast(gradient, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
        index = self._get_variable_index(variable)
        exp_avg, exp_avg_sq = self.exp_avgs[index], self.exp_avg_sqs[index]
        if self.decay and self.decoupled:
            self.assign(variable, variable * (1.0 - lr * self.decay))
        elif self.decay:
            grad = grad + self.decay * variable
        self.assign(exp_avg, self.beta_1 * exp_avg + (1.0 - self.beta_1) * grad)
        self.assign(exp_avg_sq, self.beta_2 * exp_avg_sq + (1.0 - self.beta_2) * grad * grad)
        bias_correction1 = 1.0 - ops.power(ops.cast(self.beta_1, variable.dtype), step)
        bias_correction2 = 1.0 - ops.power(ops.cast(self.beta_2, variable.dtype), step)
        denominator = ops.sqrt(exp_avg_sq) / ops.sqrt(bias_correction2) + self.eps
        self.assign_sub(variable, (lr / bias_correction1) * exp_avg / denominator)
