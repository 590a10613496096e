"""Horovod for TensorFlow (Keras 3 models), ring-allreduce over Gloo or MPI.

Horovod's TF layer predates Keras 3: `DistributedGradientTape.gradient` calls `.ref()` on each
source and Keras 3 variables have none (horovod issue 4290). Gradients are therefore taken with
respect to each Keras variable's underlying tf.Variable (`v.value`), and the initial weights are
broadcast the same way; updates still go through the Keras optimizer onto the Keras variables.

Accumulation: Horovod's own (`backward_passes_per_step`) exists only in its Keras optimizer
wrapper, which is the part Keras 3 breaks. So a step's micro-batch gradients are summed locally
in one compiled function, then each gradient is reduced with its own `hvd.allreduce` (the spec's
op and compression), as DistributedGradientTape does by default (`groups=None`); Horovod fuses
them in its background cycle. One `hvd.grouped_allreduce` of all gradients would wait for the
last gradient before any is sent, and made the step slower than the native one
(docs/engine-notes.md, Horovod).

Checkpoints hold the whole training state and resume exactly (toolkit.backends.tf.state,
shared with tf.distribute, whose checkpoints this backend continues and the other way round).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import horovod.tensorflow as hvd
import numpy as np

from toolkit.backends.base import Backend, Loader, LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.horovod.settings import check_world_size, export_environment
from toolkit.backends.tf import batches, common, state
from toolkit.backends.tf.data import make_tf_loader
from toolkit.backends.tf.loss_scale import KerasLossScale, applied_steps, use_precision
from toolkit.checkpoint import CheckpointState
from toolkit.render import horovod as render_horovod
from toolkit.sharding import LoaderPlan

tf = common.tf

OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Adasum": hvd.Adasum}
COMPRESSION = {"Compression.none": hvd.Compression.none, "Compression.fp16": hvd.Compression.fp16}


class HorovodTFBackend(Backend):
    model: Any
    optimizer: Any
    scaler: KerasLossScale | None = None
    """fp16's loss scaling (toolkit.backends.tf.loss_scale)."""

    def setup(self) -> None:
        self.scaler = use_precision(self.spec)
        common.configure_threads(self.spec, self.env)
        export_environment(self.spec, self.env)
        hvd.init()
        check_world_size(hvd.size(), self.env)
        # One GPU per process, Horovod's local rank's (its docs' pattern), or none on the CPU.
        where = dataclasses.replace(self.env, local_rank=hvd.local_rank())
        self.device = common.place_on_devices(self.spec, where, replicas=1)
        common.seed_everything(self.spec.seed)
        self._steps: dict[LossFn, Callable[..., Any]] = {}

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        self.model = common.require_keras_model(model)
        lr = self.spec.effective_lr(self.env.world_size)
        self.optimizer = optimizer or common.build_optimizer(self.spec, lr)
        if self.scaler:
            self.optimizer = self.scaler.wrap(self.optimizer)
        self.optimizer.build(self.model.trainable_variables)
        hvd.broadcast_variables([v.value for v in self.model.variables], root_rank=0)
        return self.model

    def _build_step(self, loss_fn: LossFn | None) -> Callable[..., Any]:
        model, optimizer = self.model, self.optimizer
        options = render_horovod.optimizer_options(self.spec, self.env.world_size)
        op, compression = OPS[options["op"]], COMPRESSION[options["compression"]]
        clip = self.spec.clip_grad_norm
        global_loss = self.spec.step_loss == "global"  # reduced inside the compiled step
        scaled = self.scaler is not None

        @tf.function
        def step(batch: Any) -> Any:
            keras_variables = model.trainable_variables
            sources = [v.value for v in keras_variables]
            grads, loss = common.accumulated_gradients(
                model, loss_fn, batch, sources, optimizer.scale_loss if scaled else None
            )
            grads = [hvd.allreduce(g, op=op, compression=compression) for g in grads]
            if clip > 0:
                grads = common.clip_like_torch(
                    grads, clip, optimizer.dynamic_scale if scaled else None
                )
            optimizer.apply_gradients(zip(grads, keras_variables, strict=True))
            return hvd.allreduce(loss, op=hvd.Average) if global_loss else loss

        return step

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        # Keyed by the function itself: an id() could be reused by a later, different lambda.
        # None (the model returns its own loss) is a key too.
        compiled: dict[Any, Callable[..., Any]] = self._steps
        if loss_fn not in compiled:
            compiled[loss_fn] = self._build_step(loss_fn)
        stacked = batches.stack_micro_batches(micro_batches)
        applied = applied_steps(self.optimizer) if self.scaler else 0
        loss = float(compiled[loss_fn](batches.constants(stacked)))
        if self.scaler:
            self.scaler.after_step(self.optimizer, applied)
        return loss

    @cached_property
    def _evaluator(self) -> batches.Evaluator:
        return batches.Evaluator(self.model)

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        return self._evaluator.sums(micro_batches, metric_fn, pairs=pairs)

    def make_loader(self, data: Any, plan: LoaderPlan, options: dict[str, Any]) -> Loader | None:
        return make_tf_loader(data, plan, options)

    def full_state_dict(self) -> dict[str, np.ndarray]:
        return common.numpy_state(self.model)

    def capture_state(self) -> StateShare:
        """Weights, optimizer slots and step from rank 0 (every rank holds the same), seed
        generators from every rank (toolkit.backends.tf.state), fp16's loss scale."""
        share = state.capture(self.model, self.optimizer, rank=self.env.rank)
        if self.scaler and self.env.rank == 0:
            share.extras = self.scaler.state()
        return share

    def restore_state(self, checkpoint: CheckpointState) -> None:
        """Every rank reads the whole checkpoint, so no broadcast is needed after it."""
        state.restore(self.model, self.optimizer, checkpoint, rank=self.env.rank)
        if self.scaler:
            self.scaler.load(checkpoint.extras, self.optimizer)

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        return hvd.allreduce(tf.constant(value), op=hvd.Average if op == "mean" else hvd.Sum)

    def broadcast(self, value: Any, root: int = 0) -> Any:
        return hvd.broadcast(tf.constant(value), root_rank=root)

    def barrier(self) -> None:
        # horovod.tensorflow has no barrier (horovod.torch has); a blocking allreduce is one.
        hvd.allreduce(tf.constant(0.0), op=hvd.Sum).numpy()

    def shutdown(self) -> None:
        hvd.shutdown()
