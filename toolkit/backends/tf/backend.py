"""TensorFlow tf.distribute: MirroredStrategy in one process, MultiWorkerMirroredStrategy across.

- One process with tf.local_devices > 1: the CPU is split into that many logical devices and
  MirroredStrategy keeps one replica on each (how to try data parallelism without GPUs).
- Several processes: MultiWorkerMirroredStrategy over TF_CONFIG. The toolkit's own launcher
  writes TF_CONFIG for each rank; under mpirun the ranks agree on their addresses through MPI;
  under srun they are the job's hosts; worker i listens at tf.port + i (toolkit.render.tf).

Accumulation: TensorFlow has none of its own, so one compiled step runs every micro-batch of
the step on each replica, sums the gradients locally and reduces once. Keras' optimizer then sums
over replicas (see toolkit.backends.tf.common), so each replica hands it its share, mean / n.
With clipping on, the toolkit all-reduces first, clips the mean gradient torch's way, and hands
Keras clipped / n: dividing by a power of two and summing n equal copies is exact. fp16
all-reduces first too, so that every replica's LossScaleOptimizer sees the same gradients
(toolkit.backends.tf.loss_scale).

Micro-batches of any structure are stacked leaf by leaf ([micro-batches, samples, ...]) and,
under MirroredStrategy, each leaf is split along the samples axis between the replicas.

Across processes every call that runs collectives (a step, a reduction) is held to
`timeouts.collective_s` by one watchdog thread per rank (toolkit.backends.tf.deadline), not by
TensorFlow's per-collective timeout, which starts a sleeping thread for every collective.

Each collective call gets a new instance key, as TensorFlow prefers, unless `tf.instance_keys:
per_trace` (`_choose_instance_keys`): TensorFlow resolves every new key with the peers and
keeps its record, so a worker's memory grows with every step, native scripts alike (TensorFlow
issue 42616), and each step pays the resolution (docs/engine-notes.md, TensorFlow).

Checkpoints hold the whole training state and resume exactly (toolkit.backends.tf.state,
shared with Horovod for TF, whose checkpoints this backend continues and the other way round).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cached_property
from typing import Any

import numpy as np

from toolkit.backends.base import Backend, Loader, LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.tf import batches, common, state
from toolkit.backends.tf.data import make_tf_loader
from toolkit.backends.tf.deadline import CallDeadline
from toolkit.backends.tf.loss_scale import KerasLossScale, applied_steps, use_precision
from toolkit.checkpoint import CheckpointState
from toolkit.engines import MPI_ENVIRONMENTS
from toolkit.errors import ToolkitError
from toolkit.render import tf as render_tf
from toolkit.sharding import LoaderPlan

tf = common.tf


class TFBackend(Backend):
    strategy: Any
    model: Any
    optimizer: Any
    deadline: CallDeadline | None = None
    """Across processes, the collective timeout's watchdog."""
    scaler: KerasLossScale | None = None
    """fp16's loss scaling (toolkit.backends.tf.loss_scale)."""

    @property
    def replicas_per_process(self) -> int:
        return self.spec.replicas_per_process(self.env.world_size)

    def setup(self) -> None:
        self.scaler = use_precision(self.spec)
        common.configure_threads(self.spec, self.env)
        self.device = common.place_on_devices(self.spec, self.env, self.replicas_per_process)
        if self.env.world_size > 1:
            self._export_tf_config()
            _choose_instance_keys(self.spec.tf.instance_keys)
            # No timeout_seconds: TensorFlow would start a thread per collective for it.
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=getattr(
                    tf.distribute.experimental.CommunicationImplementation,
                    render_tf.communication_options(self.spec)["implementation"],
                ),
            )
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
            self.deadline = CallDeadline(
                self.spec.timeouts.collective_s,
                f"rank {self.env.rank} on {socket.gethostname()}",
                _abort_collectives,
            )
        elif self.replicas_per_process > 1:
            self.strategy = self._mirrored(self.replicas_per_process)
        else:
            self.strategy = tf.distribute.get_strategy()
        common.seed_everything(self.spec.seed)
        self._steps: dict[LossFn, Callable[..., Any]] = {}
        self._reductions: dict[tuple[str, Any], Callable[[Any], Any]] = {}

    def _mirrored(self, replicas: int) -> Any:
        """MirroredStrategy in this process: over its GPUs under CUDA, reduced with NCCL for
        tf.communication nccl and TensorFlow's own choice for auto; on the CPU over `replicas`
        logical CPU devices. ring (and the CPU) reduce onto one device, which is exact."""
        if self.device == "cuda":
            devices = [device.name for device in tf.config.list_logical_devices("GPU")]
            reductions = {
                "nccl": tf.distribute.NcclAllReduce(),
                "auto": None,
                "ring": tf.distribute.ReductionToOneDevice(),
            }
            return tf.distribute.MirroredStrategy(
                devices=devices, cross_device_ops=reductions[self.spec.tf.communication]
            )
        self._split_cpu(replicas)
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
        )

    def _split_cpu(self, count: int) -> None:
        (cpu,) = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )

    def _export_tf_config(self) -> None:
        """TF_CONFIG for this rank, unless the launcher already gave one."""
        if "TF_CONFIG" in os.environ:
            return
        if self.env.launcher in MPI_ENVIRONMENTS:
            from toolkit.backends.mpi.rendezvous import gather_addresses

            addresses = gather_addresses(
                single_host=self.env.local_world_size == self.env.world_size,
                port=self.spec.tf.port + self.env.rank,
            )
        elif self.env.hosts:
            per_host = self.env.local_world_size
            addresses = [
                f"{self.env.hosts[rank // per_host]}:{self.spec.tf.port + rank}"
                for rank in range(self.env.world_size)
            ]
        else:
            addresses = render_tf.worker_addresses(self.spec)
        if len(addresses) != self.env.world_size:
            raise ToolkitError(
                f"{len(addresses)} TF addresses for {self.env.world_size} ranks",
                "set launch.np to the number of processes the launcher starts",
            )
        ps = render_tf.parameter_servers(self.spec)
        os.environ["TF_CONFIG"] = render_tf.tf_config_of(addresses, self.env.rank, ps)

    def scope(self) -> AbstractContextManager[Any]:
        return self.strategy.scope()

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        self.model = common.require_keras_model(model)
        with self.strategy.scope():
            lr = self.spec.effective_lr(self.env.world_size)
            self.optimizer = optimizer or common.build_optimizer(self.spec, lr)
            if self.scaler:
                self.optimizer = self.scaler.wrap(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)
        return self.model

    def _compiled_step(self, loss_fn: LossFn | None) -> Callable[..., Any]:
        # Keyed by the function itself: an id() could be reused by a later, different lambda.
        # None (the model returns its own loss) is a key too.
        compiled: dict[Any, Callable[..., Any]] = self._steps
        if loss_fn not in compiled:
            compiled[loss_fn] = self._build_step(loss_fn)
        return compiled[loss_fn]

    def _build_step(self, loss_fn: LossFn | None) -> Callable[..., Any]:
        strategy, model, optimizer = self.strategy, self.model, self.optimizer
        clip = self.spec.clip_grad_norm
        global_loss = self.spec.step_loss == "global"  # reduced inside the compiled step
        scaled = self.scaler is not None
        # fp16: every replica must see the same gradients to agree on a skip (loss_scale docs).
        reduce_first = clip > 0 or scaled

        def replica_step(batch: Any) -> Any:
            variables = model.trainable_variables
            replicas = tf.distribute.get_replica_context().num_replicas_in_sync
            grads, loss = common.accumulated_gradients(
                model, loss_fn, batch, variables, optimizer.scale_loss if scaled else None
            )
            if reduce_first:
                context = tf.distribute.get_replica_context()
                grads = [
                    g / replicas for g in context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                ]
            if clip > 0:
                scale = optimizer.dynamic_scale if scaled else None
                grads = common.clip_like_torch(grads, clip, scale)
            optimizer.apply_gradients(zip([g / replicas for g in grads], variables, strict=True))
            return loss

        @tf.function
        def step(batch: Any) -> Any:
            per_replica = strategy.run(replica_step, args=(batch,))
            if global_loss:
                return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
            # This process's replicas only: MultiWorker's reduce is a collective across workers.
            return tf.reduce_mean(tf.stack(strategy.experimental_local_results(per_replica)))

        return step

    def _distribute(self, stacked: Any) -> Any:
        """Leaves [micro-batches, replicas × micro, ...] -> each replica's [micro-batches, micro,
        ...], the structure kept."""
        replicas = self.replicas_per_process
        if replicas == 1:
            return batches.constants(stacked)

        def piece(context: Any) -> Any:
            index = context.replica_id_in_sync_group % replicas

            def share(leaf: np.ndarray) -> Any:
                micro = leaf.shape[1] // replicas
                return tf.constant(leaf[:, index * micro : (index + 1) * micro])

            return tf.nest.map_structure(share, stacked)

        return self.strategy.experimental_distribute_values_from_function(piece)

    def _bounded(self, what: str) -> AbstractContextManager[None]:
        """The collective timeout around a call that runs collectives across processes."""
        return nullcontext() if self.deadline is None else self.deadline.bounded(what)

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        stacked = batches.stack_micro_batches(micro_batches)
        applied = applied_steps(self.optimizer) if self.scaler else 0
        with self._bounded("a training step"):
            loss = float(self._compiled_step(loss_fn)(self._distribute(stacked)))
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
        """Weights, optimizer slots and step from rank 0 (replicas are identical), seed
        generators from every rank (toolkit.backends.tf.state), fp16's loss scale."""
        share = state.capture(self.model, self.optimizer, rank=self.env.rank)
        if self.scaler and self.env.rank == 0:
            share.extras = self.scaler.state()
        return share

    def restore_state(self, checkpoint: CheckpointState) -> None:
        with self.strategy.scope():
            state.restore(self.model, self.optimizer, checkpoint, rank=self.env.rank)
            if self.scaler:
                self.scaler.load(checkpoint.extras, self.optimizer)

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        """Over processes (workers); MirroredStrategy's replicas inside one process are one."""
        tensor = tf.convert_to_tensor(value)
        if self.env.world_size == 1:
            return tensor
        with self._bounded(f"an all-reduce ({op})"):
            return self._reduction(op, tensor.dtype)(tensor)

    def _reduction(self, op: str, dtype: Any) -> Callable[[Any], Any]:
        """The cross-worker reduction for `op` on tensors of `dtype` and any shape, compiled once
        and kept as a concrete function.

        Why this form (costs: docs/engine-notes.md, TensorFlow):
        - A `tf.function` defined inside `allreduce`, closing over its tensor, is traced anew
          on every call, which costs far more than the collective itself.
        - A `tf.function(reduce_retracing=True)` taking the tensor as an argument traces once,
          but each call still matches its arguments against the traces (the polymorphic
          function's dispatch), a cost that shows at small and middle sizes. The concrete
          function for `TensorSpec(shape=None)` skips that dispatch and runs as fast as the
          raw path.
        - The tensor goes through `strategy.run(tf.identity)` before it is reduced: a graph
          argument has no device, and the collective reduce needs one ("destinations can not
          be empty"); the replica's identity places it.
        """
        key = (op, dtype)
        if key not in self._reductions:
            reduce_op = tf.distribute.ReduceOp.MEAN if op == "mean" else tf.distribute.ReduceOp.SUM

            def reduce(tensor: Any) -> Any:
                per_replica = self.strategy.run(tf.identity, args=(tensor,))
                return self.strategy.reduce(reduce_op, per_replica, axis=None)

            any_shape = tf.TensorSpec(shape=None, dtype=dtype)
            self._reductions[key] = tf.function(reduce).get_concrete_function(any_shape)
        return self._reductions[key]

    def broadcast(self, value: Any, root: int = 0) -> Any:
        """Root's value on every worker: a SUM in which every other worker contributes zeros."""
        tensor = tf.constant(value)
        mine = tensor if self.env.rank == root else tf.zeros_like(tensor)
        return self.allreduce(mine, op="sum")

    def barrier(self) -> None:
        if self.env.world_size > 1:
            self.allreduce(0.0, op="sum")

    def shutdown(self) -> None:
        if self.deadline is not None:
            self.deadline.close()


def _abort_collectives(message: str) -> None:
    """Fail this process's running and later collectives with `message`, as the strategy's own
    peer health check does when a peer is unreachable (a private TensorFlow API: there is no
    public one)."""
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)


def _choose_instance_keys(choice: str) -> None:
    """`tf.instance_keys`: per_trace has MultiWorker's collectives keep the instance key they
    were traced with instead of taking a new one at every call. TensorFlow has no public
    switch; its own tests flip this class attribute (a private API)."""
    from tensorflow.python.distribute import cross_device_utils

    launcher = cross_device_utils.CollectiveReplicaLauncher
    launcher._prefer_unique_instance_key = choice == "unique"
