"""The TF engines' training state in the portable layout (toolkit.backends.tf.state), in this
process: slots under torch's names holding exactly torch's values, a capture that restores
into fresh objects and continues identically, and the refusals. Real launches resuming across
TF engines: tests/test_resume_tf_real.py."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from toolkit.checkpoint import CheckpointState
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from toolkit.backends.tf import state  # noqa: E402
from toolkit.backends.tf.common import build_optimizer  # noqa: E402

RNG = np.random.default_rng(1)
KERNEL = RNG.standard_normal((3, 2)).astype(np.float32)  # Dense [in, out]
BIAS = RNG.standard_normal(2).astype(np.float32)
GRADS = [
    (RNG.standard_normal((3, 2)).astype(np.float32), RNG.standard_normal(2).astype(np.float32))
    for _ in range(6)
]
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "sgd": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    "adam": {"name": "adam", "lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-3},
}
TORCH_SLOTS = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"]}


WARMUP_COSINE = {"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 8}


def spec(optimizer: str, schedule: dict[str, Any] | None = None) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "backend": "tf",
            "optimizer": OPTIMIZERS[optimizer],
            "schedule": schedule or WARMUP_COSINE,
        }
    )


def keras_run(optimizer: str, schedule: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """A one-layer Keras model and the spec's optimizer for it, built. The names are given:
    Keras numbers unnamed layers per process, and a second model here would be another's."""
    model = keras.Sequential(
        [keras.Input(shape=(3,)), keras.layers.Dense(2, name="fc")], name="mlp"
    )
    model.layers[0].set_weights([KERNEL, BIAS])
    built = build_optimizer(spec(optimizer, schedule), OPTIMIZERS[optimizer]["lr"])
    built.build(model.trainable_variables)
    return model, built


def keras_steps(model: Any, optimizer: Any, grads: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for kernel_grad, bias_grad in grads:
        pairs = zip([kernel_grad, bias_grad], model.trainable_variables, strict=True)
        optimizer.apply_gradients([(tf.constant(g), v) for g, v in pairs])


def torch_state_after(optimizer: str, steps: int) -> dict[str, dict[str, np.ndarray]]:
    """torch's per-parameter state after the same gradients ({"weight"|"bias": {slot: value}})."""
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(KERNEL.T))
        layer.bias.copy_(torch.from_numpy(BIAS))
    settings = OPTIMIZERS[optimizer]
    made = (
        torch.optim.SGD(layer.parameters(), lr=settings["lr"], momentum=settings["momentum"])
        if optimizer == "sgd"
        else torch.optim.Adam(
            layer.parameters(), lr=settings["lr"], betas=settings["betas"], eps=settings["eps"]
        )
    )
    for kernel_grad, bias_grad in GRADS[:steps]:
        layer.weight.grad = torch.from_numpy(kernel_grad.T.copy())
        layer.bias.grad = torch.from_numpy(bias_grad)
        made.step()
    return {
        name: {slot: value.numpy() for slot, value in made.state[p].items() if slot != "step"}
        for name, p in layer.named_parameters()
    }


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_slots_have_torch_names_and_torch_values(optimizer: str) -> None:
    model, built = keras_run(optimizer, {"name": "constant"})  # torch's side: a constant rate
    keras_steps(model, built, GRADS[:4])
    share = state.capture(model, built, rank=0)
    kernel, bias = (weight.path for weight in model.weights)
    assert share.scalars == {"step": 4}
    assert sorted(share.optimizer) == sorted(
        f"{slot}/{path}" for slot in TORCH_SLOTS[optimizer] for path in (kernel, bias)
    )
    expected = torch_state_after(optimizer, 4)
    for slot in TORCH_SLOTS[optimizer]:
        np.testing.assert_allclose(
            share.optimizer[f"{slot}/{kernel}"], expected["weight"][slot].T, rtol=1e-6, atol=1e-7
        )
        np.testing.assert_allclose(
            share.optimizer[f"{slot}/{bias}"], expected["bias"][slot], rtol=1e-6, atol=1e-7
        )


def as_checkpoint(share: Any, step: int) -> CheckpointState:
    return CheckpointState(
        step=step,
        model=share.model,
        optimizer=share.optimizer,
        scalars=share.scalars,
        arrays=share.arrays,
    )


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_restored_state_continues_exactly_with_the_schedule(optimizer: str) -> None:
    model, built = keras_run(optimizer)
    keras_steps(model, built, GRADS[:3])
    saved = as_checkpoint(state.capture(model, built, rank=0), step=3)
    keras_steps(model, built, GRADS[3:])
    fresh_model, fresh_optimizer = keras_run(optimizer)
    state.restore(fresh_model, fresh_optimizer, saved, rank=0)
    assert int(np.asarray(fresh_optimizer.iterations)) == 3
    keras_steps(fresh_model, fresh_optimizer, GRADS[3:])
    for want, got in zip(model.weights, fresh_model.weights, strict=True):
        assert np.array_equal(np.asarray(want), np.asarray(got)), want.path


def test_only_rank_0_writes_the_replicated_state_and_every_rank_its_seed_generators() -> None:
    model = keras.Sequential(
        [keras.Input(shape=(3,)), keras.layers.Dropout(0.5, seed=4), keras.layers.Dense(2)]
    )
    built = build_optimizer(spec("sgd"), 0.1)
    built.build(model.trainable_variables)
    first, second = state.capture(model, built, rank=0), state.capture(model, built, rank=1)
    assert not second.model and not second.optimizer and not second.scalars
    (key,) = second.arrays
    assert key.startswith("rng/keras/") and key.endswith("/rank1")
    ones = np.ones((64, 3), np.float32)
    drawn = np.asarray(model(ones, training=True))
    assert not np.array_equal(np.asarray(model(ones, training=True)), drawn)
    saved = CheckpointState(step=0, model=first.model, arrays=second.arrays)
    state.restore(model, built, saved, rank=1)
    assert np.array_equal(np.asarray(model(ones, training=True)), drawn)


def test_a_torch_checkpoint_is_refused_naming_what_differs() -> None:
    """A torch engine's checkpoint has state_dict names and [out, in] weights: one error."""
    model, built = keras_run("adam")
    torch_like = CheckpointState(
        step=3,
        model={"0.weight": KERNEL.T.copy(), "0.bias": BIAS},
        optimizer={"exp_avg/0.weight": KERNEL.T.copy(), "exp_avg/0.bias": BIAS},
        scalars={"step": 3},
    )
    with pytest.raises(
        ToolkitError, match=r"missing \['mlp/fc/bias', 'mlp/fc/kernel'\], unexpected \['0.bias'"
    ):
        state.restore(model, built, torch_like, rank=0)
    assert np.array_equal(np.asarray(model.weights[0]), KERNEL)  # nothing changed


def test_a_checkpoint_of_another_optimizer_or_of_a_scripts_optimizer_is_refused() -> None:
    model, sgd = keras_run("sgd")
    keras_steps(model, sgd, GRADS[:1])
    saved = as_checkpoint(state.capture(model, sgd, rank=0), step=1)
    adam = build_optimizer(spec("adam"), 0.01)
    adam.build(model.trainable_variables)
    with pytest.raises(ToolkitError, match=r"missing \['exp_avg/.*unexpected \['momentum_buffer"):
        state.restore(model, adam, saved, rank=0)
    script_optimizer = keras.optimizers.Adam()
    script_optimizer.build(model.trainable_variables)
    weights_only = state.capture(model, script_optimizer, rank=0)
    assert weights_only.model and not weights_only.optimizer
    with pytest.raises(ToolkitError, match="spec's optimizers only"):
        state.restore(model, script_optimizer, saved, rank=0)


def test_a_checkpoint_without_the_optimizer_state_of_a_run_that_stepped_is_refused() -> None:
    model, built = keras_run("adam")
    weights = CheckpointState(step=2, model=state.capture(model, built, rank=0).model)
    with pytest.raises(ToolkitError, match="missing"):
        state.restore(model, built, weights, rank=0)
