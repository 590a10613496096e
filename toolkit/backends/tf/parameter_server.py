"""TensorFlow's ParameterServerStrategy: a chief drives, workers compute, parameter servers
hold the variables.

- Roles by rank (toolkit.render.tf.task_of): rank 0 is the chief, the last `tf.ps` ranks are
  parameter servers, the ranks between are workers. Every rank runs the user's script; on a
  worker or a parameter server `toolkit.init` starts TensorFlow's server and never returns:
  the process serves until the chief has gone (`toolkit.backends.tf.servers`), then exits.
- The chief's loader reads every global batch (the job has one data-parallel replica) and
  `ClusterCoordinator.schedule` hands each step to a free worker. The worker reads the
  variables from the parameter servers, takes the mean gradient over the step's micro-batches
  and applies it there, while the other workers do the same with other batches: asynchronous
  training, each gradient computed on weights up to workers - 1 updates old. Keras 3 has no
  `model.fit` under this strategy; this loop and the TF backend's optimizers serve.
- `train_step` keeps at most one step per worker in flight and returns the loss of the latest
  step the chief has back: the first step runs alone, and later losses lag by up to
  workers - 1 steps. `evaluate`, `full_state_dict` and `shutdown` wait for every step first.
- Variables are placed whole, round-robin over the parameter servers (the strategy's default,
  without a variable partitioner).
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from toolkit.backends.base import LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.tf import batches, common
from toolkit.backends.tf.backend import TFBackend
from toolkit.backends.tf.servers import serve_until_chief_leaves
from toolkit.checkpoint import CheckpointState
from toolkit.engines import MPI_ENVIRONMENTS
from toolkit.errors import ToolkitError

tf = common.tf


TASK = re.compile(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)")


@contextmanager
def _unreachable_tasks(when: str, consequence: str, *, servers_only: bool) -> Iterator[None]:
    """TensorFlow's UnavailableError as one error naming the tasks it could not reach (with
    `servers_only`, only an error that names parameter servers)."""
    try:
        yield
    except tf.errors.UnavailableError as error:
        # A worker's error about a parameter server names both: the server is the cause.
        named = _servers_named(error) or ([] if servers_only else TASK.findall(str(error)))
        tasks = dict.fromkeys(f"{job} {task}" for job, task in named)
        if not tasks:
            raise
        raise ToolkitError(
            f"tf parameter servers: {', '.join(tasks)} cannot be reached {when}; {consequence}",
            "restart the job; the toolkit keeps no checkpoint under parameter servers yet",
        ) from None


def _servers_named(error: Exception) -> list[tuple[str, str]]:
    return [(job, task) for job, task in TASK.findall(str(error)) if job == "ps"]


def _starting() -> AbstractContextManager[None]:
    return _unreachable_tasks("as the job starts", "the job ends", servers_only=False)


def _training() -> AbstractContextManager[None]:
    """A lost parameter server ends the job: its variables are gone. A lost worker's steps
    run on the others (the coordinator's doing); only a loss it held can surface, and
    `_fetch_oldest` stands in for it."""
    return _unreachable_tasks(
        "while training", "its variables are lost, so the job ends", servers_only=True
    )


class ParameterServerBackend(TFBackend):
    coordinator: Any
    """tf.distribute.coordinator.ClusterCoordinator, on the chief."""

    @property
    def replicas_per_process(self) -> int:
        return 1

    @property
    def dp_size(self) -> int:
        return 1  # the chief reads every batch (module docs)

    @property
    def dp_rank(self) -> int:
        return 0

    def setup(self) -> None:
        common.configure_threads(self.spec, self.env)
        self.device = common.place_on_devices(self.spec, self.env, 1)
        self._export_tf_config()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if resolver.task_type != "chief":
            end_together = None
            if self.env.launcher in MPI_ENVIRONMENTS:
                from toolkit.backends.mpi.rendezvous import wait_for_every_rank_to_finish

                end_together = wait_for_every_rank_to_finish
            serve_until_chief_leaves(resolver, self.spec.timeouts.collective_s, end_together)
        self.workers = len(resolver.cluster_spec().as_dict().get("worker", []))
        with _starting():
            self.strategy = tf.distribute.ParameterServerStrategy(resolver)
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        common.seed_everything(self.spec.seed)
        self._steps = {}
        self._in_flight: deque[Any] = deque()
        self._latest_loss: float | None = None

    def _export_tf_config(self) -> None:
        if self.env.world_size < self.spec.tf.ps + 2:
            raise ToolkitError(
                f"{self.env.world_size} ranks for tf.ps {self.spec.tf.ps}: the job needs a "
                "chief and at least one worker besides the parameter servers",
                f"start at least {self.spec.tf.ps + 2} ranks (launch.np)",
            )
        super()._export_tf_config()
        cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
        missing = [role for role in ("chief", "worker", "ps") if not cluster.get(role)]
        if missing:
            raise ToolkitError(
                f"TF_CONFIG's cluster has no {' and no '.join(missing)} task, and "
                "tf.strategy parameter_server needs a chief, workers and parameter servers",
                "give TF_CONFIG's cluster chief, worker and ps tasks, or let the toolkit "
                "write TF_CONFIG",
            )

    def _build_step(self, loss_fn: LossFn | None) -> Callable[..., Any]:
        strategy, model, optimizer = self.strategy, self.model, self.optimizer
        clip = self.spec.clip_grad_norm

        def replica_step(batch: Any) -> Any:
            variables = model.trainable_variables
            grads, loss = common.accumulated_gradients(model, loss_fn, batch, variables)
            if clip > 0:
                grads = common.clip_like_torch(grads, clip)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        @tf.function
        def step(batch: Any) -> Any:
            return strategy.run(replica_step, args=(batch,))

        return step

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        batch = batches.constants(batches.stack_micro_batches(micro_batches))
        step = self._compiled_step(loss_fn)
        with _training():
            self._in_flight.append(self.coordinator.schedule(step, args=(batch,)))
            if self._latest_loss is None or len(self._in_flight) > self.workers:
                self._latest_loss = self._fetch_oldest()
        return self._latest_loss

    def _fetch_oldest(self) -> float:
        """The oldest step's loss. A worker lost after its step ran takes the loss with it
        (the step's update is on the parameter servers): the latest loss stands in for it."""
        remote = self._in_flight.popleft()
        try:
            return float(remote.fetch())
        except tf.errors.UnavailableError as error:
            if self._latest_loss is None or _servers_named(error):
                raise
            return self._latest_loss

    def _finish_steps(self) -> None:
        """Wait for every scheduled step (their errors surface here)."""
        with _training():
            self.coordinator.join()
        self._in_flight.clear()

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        self._finish_steps()
        return super().eval_sums(micro_batches, metric_fn, pairs=pairs)

    def full_state_dict(self) -> dict[str, Any]:
        self._finish_steps()
        return super().full_state_dict()

    def capture_state(self) -> StateShare:
        raise ToolkitError(
            "checkpoints under tf.strategy parameter_server are not written yet",
            "remove run.save from the script, or set tf.strategy: mirrored",
        )

    def restore_state(self, checkpoint: CheckpointState) -> None:
        raise ToolkitError(
            "checkpoints under tf.strategy parameter_server are not restored yet",
            "start without a checkpoint, or set tf.strategy: mirrored",
        )

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        """The chief is the job's one data process: every reduction is its own value."""
        return tf.convert_to_tensor(value)

    def barrier(self) -> None:
        self._finish_steps()

    def shutdown(self) -> None:
        if hasattr(self, "coordinator"):
            self._finish_steps()
