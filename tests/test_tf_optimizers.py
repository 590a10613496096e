"""The spec's optimizers mean the same update in TensorFlow as in PyTorch (single process)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from toolkit.backends.tf.optimizers import TorchAdam, TorchSGD  # noqa: E402

RNG = np.random.default_rng(0)
W0 = RNG.standard_normal((5, 3)).astype(np.float32)
GRADS = [RNG.standard_normal((5, 3)).astype(np.float32) for _ in range(8)]

CASES: list[tuple[str, Callable[[list[Any]], Any], Callable[[], Any]]] = [
    (
        "sgd-momentum-l2",
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda: TorchSGD(learning_rate=0.1, momentum=0.9, weight_decay=0.01, nesterov=False),
    ),
    (
        "sgd-nesterov",
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        lambda: TorchSGD(learning_rate=0.1, momentum=0.9, weight_decay=0.0, nesterov=True),
    ),
    (
        "adam-l2",
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.1),
        lambda: TorchAdam(
            learning_rate=0.01,
            beta_1=0.9,
            beta_2=0.99,
            epsilon=1e-3,
            weight_decay=0.1,
            decoupled=False,
        ),
    ),
    (
        "adamw",
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.1),
        lambda: TorchAdam(
            learning_rate=0.01,
            beta_1=0.9,
            beta_2=0.99,
            epsilon=1e-3,
            weight_decay=0.1,
            decoupled=True,
        ),
    ),
]


def torch_result(make: Callable[[list[Any]], Any]) -> np.ndarray:
    parameter = torch.nn.Parameter(torch.tensor(W0))
    optimizer = make([parameter])
    for grad in GRADS:
        parameter.grad = torch.tensor(grad)
        optimizer.step()
    return parameter.detach().numpy()


def tf_result(optimizer: Any) -> np.ndarray:
    variable = keras.Variable(W0)
    for grad in GRADS:
        optimizer.apply_gradients([(tf.constant(grad), variable)])
    return np.asarray(variable)


@pytest.mark.parametrize(("name", "make_torch", "make_tf"), CASES, ids=[c[0] for c in CASES])
def test_tf_update_equals_torch_update(
    name: str, make_torch: Callable[[list[Any]], Any], make_tf: Callable[[], Any]
) -> None:
    np.testing.assert_allclose(tf_result(make_tf()), torch_result(make_torch), rtol=1e-6, atol=1e-6)


def test_keras_adam_is_not_torch_adam() -> None:
    """The finding that motivates TorchAdam: Keras' epsilon sits elsewhere, so weights differ."""
    keras_adam = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
    torch_adam = torch_result(lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-3))
    assert np.max(np.abs(tf_result(keras_adam) - torch_adam)) > 1e-5


def sgd_reference(weight: np.ndarray, grads: list[np.ndarray], l2: float) -> np.ndarray:
    """torch.optim.SGD's update (dampening 0, no Nesterov) in float32 NumPy, one rounding per
    operation in torch's order: the bits TorchSGD's fused kernel must give."""
    lr, momentum = np.float32(0.1), np.float32(0.9)
    buffer = np.zeros_like(weight)
    for grad in grads:
        if l2:
            grad = grad + np.float32(l2) * weight
        buffer = buffer * momentum + grad
        weight = weight - lr * buffer
    return weight


# Sizes that are and are not multiples of the vector width: torch's own fused SGD rounds a
# tensor's last elements differently from its loop (toolkit.backends.torch_common); this
# kernel must not, in the vector part or the tail.
SHAPES = [(5, 3), (67, 33), (2211,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_fused_sgd_momentum_is_the_formula_bit_for_bit(shape: tuple[int, ...], l2: float) -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(6)]
    optimizer = TorchSGD(learning_rate=0.1, momentum=0.9, weight_decay=l2, nesterov=False)
    variable = keras.Variable(weight)
    for grad in grads:
        optimizer.apply_gradients([(tf.constant(grad), variable)])
    np.testing.assert_array_equal(np.asarray(variable), sgd_reference(weight, grads, l2))


def test_fused_sgd_momentum_under_a_distribution_strategy() -> None:
    """Under tf.distribute the optimizer updates each replica's copy of a weight, and its slot
    is a distributed variable: the fused kernel takes both handles inside the update. The
    gradient of sum(kernel * g) is g exactly, taken in the replica as the backend does."""
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        layer = keras.layers.Dense(3, use_bias=False)
        layer.build((None, 5))
        layer.kernel.assign(W0)
        optimizer = TorchSGD(learning_rate=0.1, momentum=0.9, weight_decay=0.0, nesterov=False)
        optimizer.build(layer.trainable_variables)

    def replica_step(grad: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer.kernel * grad)
        gradients = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(gradients, layer.trainable_variables, strict=True))

    @tf.function
    def step(grad: Any) -> None:
        strategy.run(replica_step, args=(grad,))

    for grad in GRADS:
        step(tf.constant(grad))
    np.testing.assert_array_equal(np.asarray(layer.kernel), sgd_reference(W0, GRADS, 0.0))
