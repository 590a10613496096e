"""DeepSpeed: ZeRO stages 0-3 (with CPU offload) and, with parallel.pipeline > 1, its pipeline
engine.

The engine gets the config `toolkit.render.deepspeed` writes from the spec, with every setting
that changes the math explicit. Accumulation is DeepSpeed's own: `engine.backward` divides the
loss by gradient_accumulation_steps and `engine.step()` only steps at the boundary; the
pipeline engine's `train_batch` pulls the step's micro-batches from an iterator itself.

DeepSpeed behaviours the backend works with (docs/engine-notes.md):
- With bf16 enabled DeepSpeed casts the whole model to bf16 and keeps fp32 master weights in its
  optimizer (unlike torch autocast), so the floating inputs the model receives are cast to its
  dtype here (toolkit.backends.torch_batches) and `full_state_dict` reads the fp32 masters
  (`safe_get_full_fp32_param`), not the bf16 copies.
- Under ZeRO-3 the module's parameters are empty shards outside `GatheredParameters`; a frozen
  parameter has no fp32 master, so it is gathered itself.
- `named_parameters()` lists a tied parameter (GPT-2's lm_head.weight is wte.weight) once, so
  weights read that way lost the second name. `full_state_dict` walks the module's own
  `state_dict(keep_vars=True)`, which lists every name, and gathers each shared tensor once.
- On the CPU accelerator `init_distributed` loads a shared-memory op (deepspeed_shm_comm) that
  serves only `inference_all_reduce`, never training: it leaves a file in /dev/shm per rank
  behind, and its JIT build's lock, left by a killed job, hangs every later start
  (docs/faults.md). The backend marks it incompatible in `deepspeed.ops.__compatible_ops__`
  so that DeepSpeed skips it; training's transport is DeepSpeed's own either way.
- Runs can abort at exit ("terminate called without an active exception") while
  DeepSpeed still holds its process groups; see `torch_common.release_process_groups`.
- The pipeline engine registers each layer under its global index, so a stage's state-dict keys
  are those of the user's nn.Sequential; the stages' dicts are merged with all_gather_object.
  What the pipeline engine accepts as a micro-batch: toolkit.backends.deepspeed.pipeline.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Sequence
from typing import Any

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.pipe import PipelineModule
from deepspeed.utils import safe_get_full_fp32_param

from toolkit.backends import torch_batches as batches
from toolkit.backends import torch_common as common
from toolkit.backends import torch_device, torch_state
from toolkit.backends.base import (
    Backend,
    LossFn,
    MetricFn,
    MicroBatch,
    StateShare,
    refuse_missing_script_optimizer,
)
from toolkit.backends.deepspeed import pipeline, state
from toolkit.backends.torch_data import TorchData
from toolkit.backends.torch_recompute import recompute
from toolkit.checkpoint import CheckpointState
from toolkit.errors import ToolkitError
from toolkit.render.deepspeed import deepspeed_config
from toolkit.spec import TrainSpec

# The builder name deepspeed.comm.torch.build_shm_op looks up in ops.__compatible_ops__.
SHM_COMM_OP = "deepspeed_shm_comm"


class DeepSpeedBackend(common.TorchCollectives, TorchData, Backend):
    engine: Any
    input_dtype: torch.dtype

    @property
    def uses_pipeline(self) -> bool:
        return self.spec.parallel.pipeline > 1

    def setup(self) -> None:
        accelerator = get_accelerator()
        if self.spec.precision == "fp16" and not accelerator.is_fp16_supported():
            raise ToolkitError(
                f"precision='fp16': DeepSpeed's {accelerator.device_name()!r} accelerator has no "
                "fp16 support on this machine",
                "use precision bf16 or fp32 here; fp16 needs a GPU",
            )
        common.configure_threads(self.spec, self.env)
        common.export_torch_env(self.env, common.rendezvous(self.spec, self.env))
        self.device = torch_device.bind_device(self.spec, self.env)
        _check_accelerator(accelerator.device_name(), self.device)
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False  # inference only (module docs)
        common.apply_collective_timeout(common.collective_timeout(self.spec))
        deepspeed.init_distributed(
            dist_backend=torch_device.group_backend(self.device),
            auto_mpi_discovery=False,
            init_method="env://",
            timeout=common.collective_timeout(self.spec),
            verbose=False,
        )

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        module = common.require_module(model)
        config = deepspeed_config(self.spec, self.env.world_size)
        if optimizer is None:
            refuse_missing_script_optimizer(self.spec)
        else:
            config.pop("optimizer", None)  # DeepSpeed refuses a client optimizer and a config one
        _configure_recompute(self.spec)
        if self.uses_pipeline:
            module = self._pipeline_module(module)
        else:
            recompute(module, self.spec.activation_checkpointing.modules, deepspeed_checkpoint)
        # The spec's schedule: DeepSpeed's own when the config carries one (its formula is the
        # spec's), else a scheduler DeepSpeed steps for us; constant needs neither.
        own_scheduler = "scheduler" in config
        self.engine, _, _, scheduler = deepspeed.initialize(
            model=module,
            model_parameters=[p for p in module.parameters() if p.requires_grad],
            optimizer=optimizer,
            config=config,
            lr_scheduler=None if own_scheduler else self._client_scheduler,
        )
        if own_scheduler:
            # DeepSpeed's schedulers start one iteration behind the optimizer step
            # (toolkit.schedule's module docs): one step aligns iteration k with step k.
            scheduler.step()
        # bf16 makes DeepSpeed cast the whole model; floating inputs must follow (module docs).
        self.input_dtype = next(self.engine.module.parameters()).dtype
        return self.engine

    def _client_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        return common.lr_scheduler(optimizer, self.spec)

    def _pipeline_module(self, module: torch.nn.Module) -> PipelineModule:
        if not isinstance(module, torch.nn.Sequential):
            raise ToolkitError(
                f"parallel.pipeline={self.spec.parallel.pipeline} needs an nn.Sequential model to "
                f"split into stages, got {type(module).__name__}",
                "express the model as torch.nn.Sequential, or set parallel.pipeline: 1",
            )
        return PipelineModule(
            layers=list(module.children()),
            num_stages=self.spec.parallel.pipeline,
            partition_method=self.spec.pipeline.partition,
            activation_checkpoint_interval=self.spec.pipeline.activation_checkpoint_interval,
            loss_fn=None,
        )

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        if self.uses_pipeline:
            stages = self.spec.parallel.pipeline
            self.engine.module.loss_fn = pipeline.require_loss_fn(loss_fn, stages)
            data = [pipeline.pipeline_batch(b, stages, self.input_dtype) for b in micro_batches]
            # Already the global mean on every stage: train_batch reduces it over the
            # data-parallel ranks and broadcasts it from the last stage.
            return float(self.engine.train_batch(data_iter=iter(data)))
        losses = []
        for batch in micro_batches:
            loss = batches.micro_batch_loss(
                self.engine, batch, loss_fn, self.input_dtype, self.device
            )
            self.engine.backward(loss)
            self.engine.step()
            losses.append(loss.detach())
        return self.reported_loss(batches.mean_loss(losses))

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        if self.uses_pipeline:
            if not pairs:
                raise pipeline.refusal(
                    self.spec.parallel.pipeline,
                    "evaluates (inputs, labels) pairs only (pairs=True)",
                )
            return pipeline.evaluate(
                self.engine,
                micro_batches,
                metric_fn,
                stages=self.spec.parallel.pipeline,
                dtype=self.input_dtype,
                world_size=self.env.world_size,
            )
        # Through the engine: under ZeRO-3 its hooks gather each layer's parameters.
        common.rank0_buffers(self.engine.module, self.broadcast_from_rank0)
        return batches.evaluate_module(
            self.engine,
            micro_batches,
            metric_fn,
            pairs=pairs,
            float_dtype=self.input_dtype,
            device=self.device,
        )

    def full_state_dict(self) -> dict[str, np.ndarray]:
        module = self.engine.module
        if not self.uses_pipeline:  # a pipeline's stages hold different layers
            common.rank0_buffers(module, self.broadcast_from_rank0)
        state: dict[str, np.ndarray] = {}
        seen: dict[int, np.ndarray] = {}
        # Every rank walks the same names in the same order: gathering is collective (ZeRO-3).
        for name, tensor in module.state_dict(keep_vars=True).items():
            if isinstance(tensor, torch.nn.Parameter):
                if id(tensor) not in seen:
                    seen[id(tensor)] = self._full_parameter(tensor)
                state[name] = seen[id(tensor)].copy()  # tied names: equal, not one array
            else:
                state[name] = common.portable(tensor)
        if self.uses_pipeline:
            stages: list[dict[str, np.ndarray]] = [{} for _ in range(self.env.world_size)]
            dist.all_gather_object(stages, state)
            state = {name: value for stage in stages for name, value in stage.items()}
        return state

    @staticmethod
    def _full_parameter(parameter: torch.nn.Parameter) -> np.ndarray:
        master = safe_get_full_fp32_param(parameter)
        if master is not None:
            return common.portable(master)
        if hasattr(parameter, "ds_id"):  # a ZeRO-3 shard with no master: frozen
            with deepspeed.zero.GatheredParameters([parameter]):
                return common.portable(parameter)
        return common.portable(parameter)

    @property
    def _partitioned(self) -> bool:
        """ZeRO-1/2/3 or the bf16 optimizer: fp32 masters cut across ranks (deepspeed.state)."""
        return any(
            state.is_zero3(p) or state.is_flat_partitioned(p)
            for p in self.engine.module.parameters()
        )

    def capture_state(self) -> StateShare:
        if self._partitioned:
            share = state.capture_partitioned(self.engine, rank=self.env.rank, dp_rank=self.dp_rank)
        else:
            share = torch_state.capture_replicated(
                self.engine.module,
                self.engine.optimizer,
                rank=self.env.rank,
                writer=self.dp_rank == 0,
            )
        if self.env.rank == 0:
            share.extras.update(
                state.loss_scaler_extras(self.engine.optimizer, self.engine.skipped_steps)
            )
        return share

    @property
    def skipped_steps(self) -> int:
        return int(self.engine.skipped_steps)

    def restore_state(self, saved: CheckpointState) -> None:
        engine = self.engine
        if self._partitioned:
            state.restore_partitioned(engine, saved, dp_rank=self.dp_rank, part=self.uses_pipeline)
        else:
            torch_state.restore_module(engine.module, saved, part=self.uses_pipeline)
            torch_state.restore_optimizer(
                engine.optimizer, engine.module, saved, part=self.uses_pipeline
            )
        torch_state.advance_scheduler(engine.lr_scheduler, saved.applied_steps)
        state.restore_loss_scaler(engine.optimizer, saved.extras)
        engine.skipped_steps = saved.step - saved.applied_steps
        torch_state.restore_rng(saved, self.env.rank)
        # The engine's own counters, as k uninterrupted steps leave them.
        engine.global_steps = saved.step
        engine.global_samples = saved.step * engine.train_batch_size()
        engine.micro_steps = saved.step * engine.gradient_accumulation_steps()

    def shutdown(self) -> None:
        # deepspeed.comm's destroy also drops DeepSpeed's cached groups; it logs on stdout.
        def destroy() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                deepspeed.comm.destroy_process_group()

        common.release_process_groups(self, ("engine",), destroy)


def _check_accelerator(accelerator: str, device: torch.device) -> None:
    """DeepSpeed's accelerator (chosen when deepspeed is imported, from DS_ACCELERATOR or the
    GPUs it finds) must be the device the spec resolved to, or the engine would place the model
    elsewhere than the toolkit places the batches."""
    if accelerator == device.type:
        return
    raise ToolkitError(
        f"the spec's device resolved to {device.type}, but DeepSpeed chose its {accelerator!r} "
        "accelerator",
        f"set DS_ACCELERATOR={device.type} in the ranks' environment (launch.env; `toolkit "
        "launch` sets it for device cpu and cuda), or set the spec's device to match",
    )


def _configure_recompute(spec: TrainSpec) -> None:
    """DeepSpeed's activation checkpointing from the spec: what `deepspeed_checkpoint` and a
    script's own `deepspeed.checkpointing.checkpoint` calls (Megatron's) then do."""
    section = spec.activation_checkpointing
    deepspeed.checkpointing.configure(
        None,
        partition_activations=section.partition_activations,
        checkpoint_in_cpu=section.cpu_checkpointing,
    )


def deepspeed_checkpoint(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """DeepSpeed's non-reentrant checkpoint (its partition and host options apply; inputs
    without gradients are fine). It takes positional arguments only."""
    return deepspeed.checkpointing.non_reentrant_checkpoint(
        functools.partial(forward, **kwargs), *args
    )
