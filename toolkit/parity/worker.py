"""One parity run: `python -m toolkit.parity.worker --spec S.json --arch mlp --steps N --out DIR`.

Under an engine (started by its real launcher) it trains through `toolkit.init`; with
`--reference FRAMEWORK` it is the single-process reference instead: a plain torch or Keras loop
that imports no toolkit backend, so that a bug shared by the backends cannot cancel out. Both
train the same steps of the same data order, and rank 0 writes the per-step losses, the final
weights in canonical form (torch names and layouts) and the steps fp16 skipped to DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.datasets import digits
from toolkit.launch.environment import split_local_rank_arg
from toolkit.parity.architectures import initial_weights, inputs_for
from toolkit.schedule import lr_ratio
from toolkit.sharding import StepLayout, epoch_order, micro_batch_indices
from toolkit.spec import TrainSpec
from toolkit.spec.batch import ResolvedBatch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one parity run")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--arch", required=True, choices=["mlp", "cnn"])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", choices=["torch", "tensorflow"])
    parser.add_argument(
        "--ranks", type=int, default=1, help="data-parallel ranks an fp16 reference cuts for"
    )
    return parser.parse_args(argv)


@dataclass
class Run:
    """What a run leaves for the comparison: per-step losses, final weights (canonical names),
    and the steps fp16 skipped for overflowed gradients."""

    losses: list[float]
    weights: dict[str, Any]
    skipped: list[int] = field(default_factory=list)


def global_batches(spec: TrainSpec, steps: int, num_samples: int) -> list[np.ndarray]:
    """The sample indices of each step's whole global batch, in the loader's order."""
    whole = StepLayout(micro=spec.batch_for().global_, accumulation=1, dp_size=1)
    order = epoch_order(num_samples, seed=spec.seed, epoch=0, shuffle=True)
    return [micro_batch_indices(order, whole, step=s, dp_rank=0)[0] for s in range(steps)]


def rank_cut(
    spec: TrainSpec, ranks: int, samples: int
) -> tuple[ResolvedBatch, Callable[[int, int], list[np.ndarray]]]:
    """The batch triple for `ranks` and, for (step, rank), the sample indices of that rank's
    micro-batches at that step, as the engine's loader cuts them (toolkit.sharding)."""
    batch = spec.batch_for(ranks)
    layout = StepLayout(micro=batch.micro, accumulation=batch.accumulation, dp_size=batch.dp)
    order = epoch_order(samples, seed=spec.seed, epoch=0, shuffle=True)

    def rank_batches(step: int, rank: int) -> list[np.ndarray]:
        return micro_batch_indices(order, layout, step=step, dp_rank=rank)

    return batch, rank_batches


def torch_optimizer(spec: TrainSpec, model: Any) -> Any:
    """The spec's optimizer as plain torch builds it, at the effective learning rate."""
    import torch

    opt, lr = spec.optimizer, spec.effective_lr()
    if opt.name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=lr,
            momentum=opt.momentum,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
        )
    adam = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
    return adam(
        model.parameters(),
        lr=lr,
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
    )


def reference_torch(spec: TrainSpec, arch: str, steps: int) -> Run:
    import torch

    from toolkit.parity import torch_models

    torch.set_num_threads(1)
    data = digits()
    x = torch.from_numpy(inputs_for(arch, data.x_train, "torch"))
    y = torch.from_numpy(data.y_train)
    model = torch_models.build(arch, initial_weights(arch, spec.seed))
    optimizer, lr = torch_optimizer(spec, model), spec.effective_lr()
    # bf16 engines are held to a bf16 reference: the same autocast, in one process.
    precision = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if spec.precision == "bf16"
        else contextlib.nullcontext()
    )
    losses = []
    for step, indices in enumerate(global_batches(spec, steps, len(y))):
        for group in optimizer.param_groups:  # the schedule, set by hand as a plain loop would
            group["lr"] = lr * lr_ratio(spec.schedule, step)
        optimizer.zero_grad()
        with precision:
            loss = torch_models.loss_fn(model(x[indices]), y[indices])
        loss.backward()
        if spec.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    weights = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    return Run(losses, weights)


def reference_torch_fp16(spec: TrainSpec, arch: str, steps: int, ranks: int) -> Run:
    """fp16 with loss scaling, in one process but cut as `ranks` data-parallel ranks cut each
    step: whether a gradient overflows fp16 depends on each micro-batch's backward (its loss is
    a share of its rank's), so the reference runs the same micro-batches, sums their scaled
    gradients and divides by the ranks, as an all-reduce average does. A step that overflows
    is skipped and the scale follows the spec's rule (toolkit.loss_scaling, DeepSpeed's)."""
    import torch

    from toolkit.loss_scaling import LossScaleRule
    from toolkit.parity import torch_models

    torch.set_num_threads(1)
    data = digits()
    x = torch.from_numpy(inputs_for(arch, data.x_train, "torch"))
    y = torch.from_numpy(data.y_train)
    model = torch_models.build(arch, initial_weights(arch, spec.seed))
    optimizer, lr = torch_optimizer(spec, model), spec.effective_lr(ranks)
    batch, rank_batches = rank_cut(spec, ranks, len(y))
    rule = LossScaleRule.from_spec(spec.loss_scaling)
    losses, skipped, applied = [], [], 0
    for step in range(steps):
        for group in optimizer.param_groups:  # the schedule moves with applied steps only
            group["lr"] = lr * lr_ratio(spec.schedule, applied)
        optimizer.zero_grad()
        step_losses = []
        for rank in range(batch.dp):
            for indices in rank_batches(step, rank):
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = torch_models.loss_fn(model(x[indices]), y[indices])
                share = loss / batch.accumulation if batch.accumulation > 1 else loss
                (share * rule.scale).backward()  # as an engine's GradScaler does
                step_losses.append(float(loss.detach()))
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        for grad in grads:
            grad.div_(batch.dp * rule.scale)
        overflow = not all(bool(torch.isfinite(grad).all()) for grad in grads)
        if not overflow:
            if spec.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
            optimizer.step()
            applied += 1
        else:
            skipped.append(step)
        rule.update(overflow)
        losses.append(float(np.mean(step_losses)))
    weights = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    return Run(losses, weights, skipped)


def keras_optimizer(spec: TrainSpec, lr: float) -> Any:
    """The spec's optimizer with torch's update rule, as the TF engines build it."""
    from toolkit.backends.tf.optimizers import TorchAdam, TorchSGD

    opt = spec.optimizer
    if opt.name == "sgd":
        return TorchSGD(
            learning_rate=lr,
            momentum=opt.momentum,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
        )
    return TorchAdam(
        learning_rate=lr,
        beta_1=opt.betas[0],
        beta_2=opt.betas[1],
        epsilon=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=opt.name == "adamw",
    )


def reference_torch_local_sgd(spec: TrainSpec, arch: str, steps: int, ranks: int) -> Run:
    """Local SGD as its definition reads, one model and optimizer per rank in one process:
    for `ddp.sync.after` steps every rank steps on the ranks' mean gradient, then each on its
    own micro-batches' alone, and every `ddp.sync.every_steps` steps from `after` on (counting
    steps from 0) each parameter is replaced by the ranks' mean. Rank 0's weights are the
    result, as rank 0 writes the engine's."""
    import torch

    from toolkit.parity import torch_models

    torch.set_num_threads(1)
    data = digits()
    x = torch.from_numpy(inputs_for(arch, data.x_train, "torch"))
    y = torch.from_numpy(data.y_train)
    models = [torch_models.build(arch, initial_weights(arch, spec.seed)) for _ in range(ranks)]
    optimizers = [torch_optimizer(spec, model) for model in models]
    lr = spec.effective_lr(ranks)
    batch, rank_batches = rank_cut(spec, ranks, len(y))
    sync = spec.ddp.sync
    losses = []
    for step in range(steps):
        step_losses = []
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_ratio(spec.schedule, step)
            optimizer.zero_grad()
            for indices in rank_batches(step, rank):
                loss = torch_models.loss_fn(model(x[indices]), y[indices])
                share = loss / batch.accumulation if batch.accumulation > 1 else loss
                share.backward()
                step_losses.append(float(loss.detach()))
        if step < sync.after:  # synchronous: every rank steps on the mean gradient
            for params in zip(*(model.parameters() for model in models), strict=True):
                mean = sum(p.grad / ranks for p in params)
                for p in params:
                    p.grad = mean.clone()
        for model, optimizer in zip(models, optimizers, strict=True):
            if spec.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
            optimizer.step()
        if step >= sync.after and (step - sync.after) % sync.every_steps == 0:
            with torch.no_grad():
                for params in zip(*(model.parameters() for model in models), strict=True):
                    mean = sum(p / ranks for p in params)
                    for p in params:
                        p.copy_(mean)
        losses.append(float(np.mean(step_losses)))
    weights = {name: t.detach().numpy().copy() for name, t in models[0].state_dict().items()}
    return Run(losses, weights)


def reference_tensorflow(spec: TrainSpec, arch: str, steps: int) -> Run:
    import tensorflow as tf

    from toolkit.parity import keras_models

    tf.config.threading.set_intra_op_parallelism_threads(1)
    data = digits()
    x, y = inputs_for(arch, data.x_train, "tensorflow"), data.y_train
    model = keras_models.build(arch, initial_weights(arch, spec.seed))
    lr = spec.effective_lr()
    optimizer = keras_optimizer(spec, lr)
    losses = []
    for step, indices in enumerate(global_batches(spec, steps, len(y))):
        optimizer.learning_rate.assign(lr * lr_ratio(spec.schedule, step))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras_models.loss_fn(model(x[indices]), y[indices]))
        grads = tape.gradient(loss, model.trainable_variables)
        if spec.clip_grad_norm > 0:
            norm = tf.linalg.global_norm(grads)
            grads = [g * tf.minimum(1.0, spec.clip_grad_norm / (norm + 1e-6)) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss))
    return Run(losses, keras_models.canonical(arch, [np.asarray(w) for w in model.weights]))


def reference_tensorflow_fp16(spec: TrainSpec, arch: str, steps: int, ranks: int) -> Run:
    """reference_torch_fp16's loop in Keras: a mixed_float16 model, each rank's micro-batches
    as the engine cuts them, the scaled shares' gradients summed and averaged over the ranks,
    the spec's loss-scaling rule; no LossScaleOptimizer, whose use the engines are tested on."""
    import tensorflow as tf

    from toolkit.loss_scaling import LossScaleRule
    from toolkit.parity import keras_models

    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras_models.use_fp16()
    data = digits()
    x, y = inputs_for(arch, data.x_train, "tensorflow"), data.y_train
    model = keras_models.build(arch, initial_weights(arch, spec.seed))
    lr = spec.effective_lr(ranks)
    optimizer = keras_optimizer(spec, lr)
    batch, rank_batches = rank_cut(spec, ranks, len(y))
    rule = LossScaleRule.from_spec(spec.loss_scaling)
    losses, skipped, applied = [], [], 0
    for step in range(steps):
        optimizer.learning_rate.assign(lr * lr_ratio(spec.schedule, applied))
        total: list[Any] = []
        step_losses = []
        for rank in range(batch.dp):
            for indices in rank_batches(step, rank):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(keras_models.loss_fn(model(x[indices]), y[indices]))
                    share = loss / batch.accumulation if batch.accumulation > 1 else loss
                    scaled = share * rule.scale
                grads = tape.gradient(scaled, model.trainable_variables)
                total = grads if not total else [a + g for a, g in zip(total, grads, strict=True)]
                step_losses.append(float(loss))
        grads = [g / batch.dp / rule.scale for g in total]
        overflow = not all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
        if not overflow:
            if spec.clip_grad_norm > 0:
                norm = tf.linalg.global_norm(grads)
                grads = [g * tf.minimum(1.0, spec.clip_grad_norm / (norm + 1e-6)) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            applied += 1
        else:
            skipped.append(step)
        rule.update(overflow)
        losses.append(float(np.mean(step_losses)))
    weights = keras_models.canonical(arch, [np.asarray(w) for w in model.weights])
    return Run(losses, weights, skipped)


def engine_run(spec: TrainSpec, arch: str, steps: int) -> tuple[Run, bool]:
    import toolkit

    run = toolkit.init(spec)
    data = digits()
    framework = spec.framework_name
    x = inputs_for(arch, data.x_train, framework)
    start = initial_weights(arch, spec.seed)
    if framework == "torch":
        from toolkit.parity import torch_models as models
    else:
        from toolkit.parity import keras_models as models  # type: ignore[no-redef]
    with run.scope():
        model = models.build(arch, start)
    run.prepare(model)
    losses: list[float] = []
    skipped: list[int] = []
    for micro_batches in run.loader((x, data.y_train)):
        if len(losses) == steps:
            break
        before = run.skipped_steps
        losses.append(run.train_step(micro_batches, models.loss_fn))
        if run.skipped_steps > before:
            skipped.append(len(losses) - 1)
    state = run.full_state_dict()
    if framework != "torch":
        from toolkit.parity import keras_models

        state = keras_models.canonical(arch, list(state.values()))
    is_main = run.is_main
    run.shutdown()
    return Run(losses, state, skipped), is_main


def main() -> int:
    args = parse_args(split_local_rank_arg(sys.argv[1:])[0])  # the deepspeed launcher's
    spec = TrainSpec.from_dict(json.loads(Path(args.spec).read_text()))
    if args.reference == "torch" and spec.ddp.sync.local:
        result, write = reference_torch_local_sgd(spec, args.arch, args.steps, args.ranks), True
    elif args.reference == "torch" and spec.precision == "fp16":
        result, write = reference_torch_fp16(spec, args.arch, args.steps, args.ranks), True
    elif args.reference == "torch":
        result, write = reference_torch(spec, args.arch, args.steps), True
    elif args.reference == "tensorflow" and spec.precision == "fp16":
        result, write = reference_tensorflow_fp16(spec, args.arch, args.steps, args.ranks), True
    elif args.reference == "tensorflow":
        result, write = reference_tensorflow(spec, args.arch, args.steps), True
    else:
        result, write = engine_run(spec, args.arch, args.steps)
    if write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "weights.npz", **result.weights)
        (out / "losses.json").write_text(json.dumps(result.losses))
        (out / "skipped.json").write_text(json.dumps(result.skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
