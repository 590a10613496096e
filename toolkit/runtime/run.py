"""`toolkit.init(spec)` and the `Run` it returns: the same training loop on every engine.

    run = toolkit.init(spec)
    model = run.prepare(model)
    for micro_batches in run.steps(run.loader((x, y)), epochs=3):
        loss = run.train_step(micro_batches, loss_fn)
    metrics = run.evaluate(run.loader((x_test, y_test), shuffle=False), metric_fn)
    weights = run.full_state_dict()
    run.save("ckpt")          # or every checkpoint.every_steps steps into checkpoint.dir
    run.load("ckpt")          # after prepare; automatic when checkpoint.dir holds one

`run.loader` also takes a dict (or any nesting) of arrays, a torch Dataset or IterableDataset
(torch engines, DataLoader workers allowed) and a tf.data.Dataset (TF engines); a model that
computes its own loss from the whole micro-batch trains with `run.train_step(micro_batches)`.

No engine is imported here: `init` detects the launcher, refuses a launcher the backend cannot
run under, then loads the backend class from the registry.
"""

from __future__ import annotations

import atexit
import gc
import os
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.backends.base import (
    Backend,
    Loader,
    LossFn,
    MetricFn,
    MicroBatch,
    add_metrics,
)
from toolkit.backends.registry import check_environment, load_backend_class
from toolkit.checkpoint import Checkpoint, open_checkpoint
from toolkit.checkpoint.layout import step_name
from toolkit.checkpoint.state import split_optimizer_key
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment, detect_environment
from toolkit.launch.rank_side import join_supervisor
from toolkit.runtime.evaluation import Metrics, micro_batch_groups, own_loss_metrics
from toolkit.runtime.loader import ArrayLoader, refuse_unusable
from toolkit.runtime.preemption import Preemption, exit_preempted
from toolkit.runtime.progress import progress
from toolkit.runtime.resume import (
    DataPosition,
    announce,
    checkpoint_to_resume,
    restore_host_rng,
)
from toolkit.runtime.saving import Saver
from toolkit.sharding import LoaderPlan, StepLayout
from toolkit.spec import TrainSpec


class Run:
    def __init__(
        self,
        spec: TrainSpec,
        env: LaunchEnvironment,
        backend: Backend,
        resume: Checkpoint | None = None,
    ) -> None:
        self.spec = spec
        self.env = env
        self.backend = backend
        self.step = 0
        self._bar: Any = None  # the training progress bar while run.steps() runs
        self._postfix: dict[str, str] = {}
        self._resume = resume  # restored by prepare (toolkit.runtime.resume)
        self._own_optimizer = True
        self._start = DataPosition()  # where the next run.steps() begins
        self._position = DataPosition()  # after the step last handed out by run.steps()
        self._preemption: Preemption | None = None
        self._saver = Saver(
            spec,
            backend,
            rank=env.rank,
            ranks=env.world_size,
            global_batch=self.layout().global_batch,
        )
        if spec.checkpoint.save_on_signal:
            self._preemption = Preemption()
            self._preemption.install()

    # -- where this process stands ------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def device(self) -> Any:
        """Where this rank trains: a torch.device for the torch engines (`cuda:<local rank>`
        under CUDA), "cpu" or "cuda" for the TensorFlow engines (spec `device`)."""
        return self.backend.device

    @property
    def dp_size(self) -> int:
        return self.backend.dp_size * self.backend.replicas_per_process

    # -- the loop -----------------------------------------------------------------------------
    def scope(self) -> AbstractContextManager[Any]:
        """Build TensorFlow models inside `with run.scope():` (a no-op for torch)."""
        return self.backend.scope()

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        """Wrap the model for the engine; then, when this run resumes, put the checkpoint's
        state back (see toolkit.runtime.resume for why here)."""
        self._own_optimizer = optimizer is None
        prepared = self.backend.prepare(model, optimizer)
        if self._resume is not None:
            resume, self._resume = self._resume, None
            self.load(resume.path)
        return prepared

    def layout(self) -> StepLayout:
        batch = self.spec.batch_for(self.env.world_size)
        return StepLayout(micro=batch.micro, accumulation=batch.accumulation, dp_size=batch.dp)

    def loader(self, data: Any, *, shuffle: bool | None = None, **options: Any) -> Loader:
        """This process's share of every global batch of `data`, step by step.

        `data`: arrays of any structure, a torch Dataset / IterableDataset (torch engines; options
        such as num_workers= and collate_fn= go to the DataLoader) or a tf.data.Dataset (TF
        engines); see toolkit.runtime.loader. `shuffle`: None shuffles what can be indexed
        (a permutation of seed and epoch) and leaves a stream's order as it is; False keeps
        the order (evaluation).
        """
        replicas = self.backend.replicas_per_process
        first = self.backend.dp_rank * replicas
        plan = LoaderPlan(
            layout=self.layout(),
            dp_ranks=tuple(range(first, first + replicas)),
            seed=self.spec.seed,
            shuffle=shuffle,
        )
        made = self.backend.make_loader(data, plan, options)
        if made is not None:
            return made
        refuse_unusable(data, self.spec.framework_name, options)
        return ArrayLoader(data, plan)

    def steps(
        self, loader: Loader, *, epochs: int = 1, desc: str = "train"
    ) -> Iterator[list[MicroBatch]]:
        """Every step's micro-batches for `epochs` epochs, with a progress bar on rank 0; the
        bar shows the last step's loss and the last evaluation beside it."""
        per_epoch = loader.steps_per_epoch
        start, self._start = self._start, DataPosition()
        if per_epoch is not None:  # a resumed run starts where the saved one stopped
            more, steps = divmod(start.steps, per_epoch)
            start = DataPosition(start.epoch + more, steps)
        total = None if per_epoch is None else epochs * per_epoch
        with progress(total=total, desc=desc, enabled=self.is_main) as bar:
            self._bar = bar
            if per_epoch is not None:
                bar.update(min(epochs * per_epoch, start.epoch * per_epoch + start.steps))
            try:
                for epoch in range(start.epoch, epochs):
                    loader.set_epoch(epoch)
                    skip = start.steps if epoch == start.epoch else 0
                    # Skipped steps are read and dropped: the order is fixed per (seed, epoch).
                    batches = islice(iter(loader), skip, None)
                    for index, micro_batches in enumerate(batches, start=skip):
                        self._position = DataPosition(epoch, index + 1)
                        yield micro_batches
                        bar.update(1)
            finally:
                self._bar = None

    def train_step(
        self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None = None
    ) -> float:
        """One optimizer step over this process's micro-batches; their mean loss, or with
        `step_loss: global` in the spec the mean over every rank's (one all-reduce per step).

        With `loss_fn`, each micro-batch is (inputs, targets) and the loss is
        loss_fn(model(inputs), targets); without one, the model gets the whole micro-batch (a
        dict as keyword arguments under torch) and returns its own loss, or an object with
        `.loss` (Hugging Face models).

        With checkpoint.save_on_signal, a step after which any rank has received SIGTERM or
        SIGUSR1 saves and ends the process with status 75 (toolkit.runtime.preemption).
        """
        loss = self.backend.train_step(micro_batches, loss_fn)
        self.step += 1
        self._show(**{self.loss_label: f"{loss:.4g}"})
        every = self.spec.checkpoint.every_steps
        if every and self.step % every == 0:
            self._saver.periodic(self.step, self._position)
        if self._preemption is not None and self._preemption.agreed(self.backend):
            self._saver.settle(self.step)
            saved = self._checkpoint_root(None) / step_name(self.step)
            if self._saver.saved_step != self.step:
                saved = self.save()
            received = self._preemption.received
            self.shutdown()
            raise exit_preempted(self.step, str(saved), self.rank, received)
        return loss

    @property
    def skipped_steps(self) -> int:
        """Steps that fp16 skipped because their gradients overflowed (DeepSpeed's
        `engine.skipped_steps`): they count in `step` but moved no weight and no schedule."""
        return self.backend.skipped_steps

    @property
    def loss_label(self) -> str:
        """The name of what train_step returns, as rank 0 shows it (the bar, plots): rank 0's
        own loss unless the spec asks for the mean over every rank (step_loss)."""
        return "loss" if self.spec.step_loss == "global" else "rank0_loss"

    def evaluate(
        self,
        batches: Loader | Iterable[MicroBatch],
        metric_fn: MetricFn | None = None,
        *,
        pairs: bool = True,
        desc: str = "eval",
    ) -> Metrics:
        """A no-gradient pass over `batches`; each metric summed over micro-batches and ranks.

        `batches`: a loader from run.loader(..., shuffle=False), or any iterable of this
        process's micro-batches (every rank must give the same number). `metric_fn(outputs,
        targets)` returns the micro-batch's sums (toolkit.runtime.evaluation). `pairs=False`:
        the model gets the whole micro-batch and metric_fn gets (outputs, micro_batch); without
        a metric_fn it then sums the model's own loss weighed by samples ("loss_sum", "count").
        """
        if metric_fn is None:
            if pairs:
                raise ToolkitError(
                    "evaluate() needs a metric_fn for (inputs, targets) micro-batches",
                    "pass metric_fn=lambda outputs, targets: {'loss_sum': ..., 'count': ...}, "
                    "or pairs=False for a model that returns its own loss",
                )
            metric_fn = own_loss_metrics
        local: dict[str, float] = {}
        per_epoch = batches.steps_per_epoch if isinstance(batches, Loader) else None
        # Inside training the result goes beside the training bar; alone, beside its own.
        alone = self._bar is None
        with progress(total=per_epoch, desc=desc, enabled=self.is_main, leave=alone) as bar:
            for group in micro_batch_groups(batches):
                share = self.backend.eval_sums(group, metric_fn, pairs=pairs)
                if share:
                    add_metrics(local, share, float)
                bar.update(1)
            metrics = Metrics(self.backend.sum_over_ranks(local))
            if not metrics:
                raise ToolkitError(
                    "evaluate() saw no micro-batches on any rank",
                    "pass a held-out set of at least one global batch",
                )
            shown = {f"{desc}_{name}": f"{value:.4g}" for name, value in metrics.summary().items()}
            if alone and self.is_main:
                bar.set_postfix(shown)
        self._show(**shown)
        return metrics

    def _show(self, **values: str) -> None:
        """Beside the training progress bar on rank 0 (tqdm's postfix)."""
        self._postfix.update(values)
        if self._bar is not None and self.is_main:
            self._bar.set_postfix(self._postfix, refresh=False)

    def full_state_dict(self) -> dict[str, np.ndarray]:
        return self.backend.full_state_dict()

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Save the whole training state as `path/step-N` (default: checkpoint.dir), every rank
        writing what it holds, rank 0 committing it; returns the step directory.

        Collective: every rank calls it. Holds full fp32 weights, optimizer state, schedule
        position, loss scaler, every rank's random generators and the data position
        (toolkit.checkpoint). In checkpoint.dir the newest checkpoint.keep are kept. Always
        synchronous (a background save in flight is finished first); a save that cannot be
        written raises SaveFailed on every rank and leaves what was saved before as it was.
        """
        return self._saver.save(self._checkpoint_root(path), self.step, self._position)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Continue from the checkpoint at `path` (a checkpoint directory, whose latest is
        taken, or one step-N in it), saved by any engine and world size. Call after prepare;
        the next `run.steps` starts at the saved data position."""
        checkpoint = open_checkpoint(path)
        self._check_optimizer(checkpoint)
        state = checkpoint.state()
        self.backend.restore_state(state)
        restore_host_rng(state, self.rank)
        self.step = state.step
        self._start = DataPosition.from_extras(state.extras, self.layout().global_batch)
        self._position = self._start

    def _checkpoint_root(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return Path(path)
        if self.spec.checkpoint.dir is None:
            raise ToolkitError(
                "run.save() without a path needs checkpoint.dir in the spec",
                "pass a directory, run.save('ckpt'), or set checkpoint: {dir: ckpt}",
            )
        return Path(self.spec.checkpoint.dir)

    def _check_optimizer(self, checkpoint: Checkpoint) -> None:
        """A checkpoint of another optimizer's state cannot continue this one's."""
        saved = {split_optimizer_key(name)[0] for name in checkpoint.names("optimizer")}
        saved.discard("step")
        expected = optimizer_slots(self.spec)
        if self._own_optimizer and saved and saved != expected:
            raise ToolkitError(
                f"{checkpoint.path} holds optimizer state {sorted(saved)}, but this run's "
                f"optimizer ({self.spec.optimizer.name}) keeps {sorted(expected)}",
                "resume with the optimizer the checkpoint was saved with, or set "
                "checkpoint.resume: never",
            )

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, value: Any, op: str = "mean") -> Any:
        """The mean (or sum) of `value` over all ranks, as a new tensor; `value` is unchanged."""
        return self.backend.allreduce(value, op)

    def allreduce_(self, tensor: Any, op: str = "mean") -> Any:
        """Reduce a torch tensor in place and return it: no copy (see Backend.allreduce_)."""
        return self.backend.allreduce_(tensor, op)

    def broadcast(self, value: Any, root: int = 0) -> Any:
        return self.backend.broadcast(value, root)

    def barrier(self) -> None:
        self.backend.barrier()

    def shutdown(self) -> None:
        """Finish a background save in flight, then release the engine; safe to call twice."""
        try:
            self._saver.close()
        finally:
            self.backend.shutdown()


def init(spec: TrainSpec, *, launcher: str | None = None, argv: Sequence[str] | None = None) -> Run:
    """Detect the launcher, check the backend runs under it, seed, and start the engine.

    At exit, garbage the script left in reference cycles is collected while the interpreter
    is still whole. Process groups that only a cycle keeps alive (an engine, its optimizer and
    the hooks on the model's parameters refer to each other) are otherwise destroyed during
    interpreter finalization, when a gloo worker thread that still drops a finished
    collective's tensors cannot take the GIL and is unwound through a noexcept destructor: the
    abort at exit, "terminate called without an active exception" (docs/engine-notes.md).
    `Run.shutdown` releases the groups explicitly; this covers scripts that end without it.
    """
    env = detect_environment(os.environ, sys.argv if argv is None else argv, launcher)
    check_environment(spec.backend, spec.framework_name, env.launcher)
    join_supervisor(env.rank)  # heartbeats to `toolkit launch`, if it started this process
    random.seed(spec.seed)
    np.random.seed(spec.seed % 2**32)
    backend_class = load_backend_class(
        spec.backend, spec.framework_name, parameter_server=spec.parameter_server
    )
    backend = backend_class(spec, env)
    backend.setup()
    atexit.register(gc.collect)  # after the script's own exit handlers: atexit runs LIFO
    resume = checkpoint_to_resume(spec)
    if env.rank == 0:
        announce(resume)
    return Run(spec, env, backend, resume.checkpoint)


def optimizer_slots(spec: TrainSpec) -> set[str]:
    """The per-parameter state the spec's optimizer keeps (torch's slot names)."""
    if spec.optimizer.name == "sgd":
        return {"momentum_buffer"} if spec.optimizer.momentum else set()
    return {"exp_avg", "exp_avg_sq"}
