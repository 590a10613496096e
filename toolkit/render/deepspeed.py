"""TrainSpec -> DeepSpeed config dict, with every setting that changes the math written out.

Pure: imports no engine. Checked against DeepSpeed 0.19.8's own `DeepSpeedConfig` and pydantic
sub-models in tests/test_render_deepspeed.py. DeepSpeed behaviours that shape it (more in
docs/engine-notes.md):

- `gradient_clipping` defaults to 1.0 in DeepSpeed (`GRADIENT_CLIPPING_DEFAULT`), not 0: a
  config that leaves it out clips every step at norm 1.0, unlike DDP or Horovod. It is the
  global-norm max (torch's `clip_grad_norm_`), and 0 turns it off, so `clip_grad_norm` maps
  onto it one to one and is always written.
- Optimizer type "Adam" runs AdamW (decoupled weight decay) unless `adam_w_mode` is false: the
  engine computes `adam_w_mode = name == "adamw" or params.get("adam_w_mode", True)`. So
  `adam` is written as {"type": "Adam", "adam_w_mode": false} and `adamw` as
  {"type": "AdamW", "adam_w_mode": true}, never leaving the flag to the default.
- `torch_adam: true` makes DeepSpeed build `torch.optim.Adam/AdamW` (the reference's exact
  optimizer, and no JIT-compiled FusedAdam, which a machine without CUDA cannot build). With
  optimizer offload DeepSpeed insists on `DeepSpeedCPUAdam` (`zero_force_ds_cpu_optimizer`,
  default true, rejects a torch optimizer), so offload writes `torch_adam: false`; CPU Adam
  implements the same update (bias-corrected, fp32 states).
- `bias_correction: false` (BERT's Adam) is an argument of DeepSpeed's own Adam (FusedAdam, CPU
  Adam), not of torch's, which always corrects: it is rendered with `torch_adam: false`.
- `optimizer.name: script` renders no optimizer section: the script passes its own to
  `deepspeed.initialize`. The `deepspeed` section's keys (guard flags, pre-division, auto_cast,
  dtypes) are rendered as written, e.g. Megatron's `zero_allow_untested_optimizer: true`.
- "SGD" is not one of DeepSpeed's named optimizers: the engine falls back to
  `getattr(torch.optim, type)`, so the type must be spelled "SGD". torch.optim.SGD is not in
  ZeRO's tested list, so ZeRO stages > 0 need `zero_allow_untested_optimizer: true`.
- `overlap_comm` defaults to None, meaning true at stage 3 and false otherwise; it is resolved
  and written. `gradient_allreduce_op` "mean", `prescale_gradients` false,
  `gradient_predivide_factor` 1.0, `communication_data_type` and `data_types.grad_accum_dtype`
  (both default to the model dtype) are written so gradient averaging is explicit.
- ZeRO-1/2 compute the global gradient norm at every step, clipping or not (an all-reduce
  and a pass over the gradients), and in fp32 skip a step whose norm is inf or NaN, which no
  other engine does (ZeRO-0 and 3 included: only their fp16 checks for overflow). Without the
  norm (`compute_grad_norm: false`, 0.19.8, stages 1-2, no clipping, no optimizer offload)
  they apply such a step as DDP does, and `engine.get_global_grad_norm()` returns None.
  `zero.compute_grad_norm` null resolves to false wherever DeepSpeed allows it.
- `DeepSpeedConfig` only reads the data-parallel size from `mpu` once `deepspeed.comm` is
  initialised; otherwise it silently assumes a world of 1 (tests patch `dist.get_rank`).
- The pipeline engine rejects ZeRO stages 2 and 3; its batch triple counts data-parallel ranks
  (world / stages), like the spec's.
"""

from __future__ import annotations

from typing import Any

from toolkit.schedule import deepspeed_scheduler
from toolkit.spec import TrainSpec

SCRIPT_OPTIMIZER = "script"
"""optimizer.name for "the script passes its own optimizer": no optimizer section."""


def _allow_untested(spec: TrainSpec) -> bool:
    """zero_allow_untested_optimizer: as the spec says, else true only where the spec's own
    optimizer needs it (torch.optim.SGD is not in ZeRO's tested list)."""
    written = spec.deepspeed.zero_allow_untested_optimizer
    if written is not None:
        return written
    return spec.optimizer.name == "sgd" and spec.zero.stage > 0


def optimizer_section(spec: TrainSpec, lr: float) -> dict[str, Any] | None:
    """DeepSpeed's "optimizer" block for the spec's optimizer at learning rate `lr`; None when
    the script brings its own optimizer (optimizer.name script)."""
    opt = spec.optimizer
    if opt.name == SCRIPT_OPTIMIZER:
        return None
    if opt.name == "sgd":
        return {
            "type": "SGD",
            "params": {
                "lr": lr,
                "momentum": opt.momentum,
                "dampening": 0.0,
                "weight_decay": opt.weight_decay,
                "nesterov": opt.nesterov,
            },
        }
    # torch's Adam always corrects bias (and takes no such argument): without bias correction
    # DeepSpeed's own Adam (FusedAdam, or CPU Adam under offload) runs, told so explicitly.
    torch_adam = spec.zero.offload_optimizer == "none" and opt.bias_correction
    params: dict[str, Any] = {
        "lr": lr,
        "betas": list(opt.betas),
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
        "adam_w_mode": opt.name == "adamw",
        "torch_adam": torch_adam,
    }
    if not torch_adam:
        params["bias_correction"] = opt.bias_correction
    return {"type": "AdamW" if opt.name == "adamw" else "Adam", "params": params}


def _offload(device: str, spec: TrainSpec) -> dict[str, Any]:
    section: dict[str, Any] = {"device": device, "pin_memory": spec.zero.pin_memory}
    if device == "nvme":
        section["nvme_path"] = spec.zero.nvme_path
    return section


def zero_section(spec: TrainSpec) -> dict[str, Any]:
    """DeepSpeed's "zero_optimization" block."""
    zero = spec.zero
    overlap = zero.stage == 3 if zero.overlap_comm is None else zero.overlap_comm
    return {
        "stage": zero.stage,
        "contiguous_gradients": zero.contiguous_gradients,
        "overlap_comm": overlap,
        "reduce_scatter": True,
        "reduce_bucket_size": zero.reduce_bucket_size,
        "use_multi_rank_bucket_allreduce": zero.multi_rank_bucket_allreduce,
        "compute_grad_norm": spec.computes_grad_norm,
        "allgather_partitions": True,
        "allgather_bucket_size": zero.allgather_bucket_size,
        "round_robin_gradients": False,
        "offload_optimizer": _offload(zero.offload_optimizer, spec),
        "offload_param": _offload(zero.offload_params, spec),
        "sub_group_size": zero.sub_group_size,
        "stage3_prefetch_bucket_size": zero.stage3_prefetch_bucket_size,
        "stage3_param_persistence_threshold": zero.stage3_param_persistence_threshold,
        "stage3_max_live_parameters": zero.stage3_max_live_parameters,
        "stage3_max_reuse_distance": zero.stage3_max_reuse_distance,
        "stage3_gather_16bit_weights_on_model_save": zero.stage3_gather_16bit_weights_on_model_save,
    }


def deepspeed_config(spec: TrainSpec, world_size: int | None = None) -> dict[str, Any]:
    """The ds_config dict for `world_size` ranks (default: the spec's launch.np)."""
    batch = spec.batch_for(world_size)
    scaling = spec.loss_scaling
    dtype = spec.precision
    ds = spec.deepspeed
    config: dict[str, Any] = {
        "train_batch_size": batch.global_,
        "train_micro_batch_size_per_gpu": batch.micro,
        "gradient_accumulation_steps": batch.accumulation,
        "gradient_clipping": spec.clip_grad_norm,
        "optimizer": optimizer_section(spec, spec.effective_lr(world_size)),
        "fp16": {
            "enabled": spec.precision == "fp16",
            "auto_cast": ds.auto_cast,
            "loss_scale": scaling.loss_scale,
            "initial_scale_power": scaling.initial_scale_power,
            "loss_scale_window": scaling.loss_scale_window,
            "hysteresis": scaling.hysteresis,
            "consecutive_hysteresis": scaling.consecutive_hysteresis,
            "min_loss_scale": scaling.min_loss_scale,
        },
        "bf16": {"enabled": spec.precision == "bf16"},
        "zero_optimization": zero_section(spec),
        "zero_allow_untested_optimizer": _allow_untested(spec),
        "zero_force_ds_cpu_optimizer": ds.zero_force_ds_cpu_optimizer,
        "gradient_allreduce_op": "mean",
        "prescale_gradients": ds.prescale_gradients,
        "gradient_predivide_factor": ds.gradient_predivide_factor,
        # compression: fp16 is DeepSpeed's reduce in fp16 (the spec refuses another dtype).
        "communication_data_type": ds.communication_data_type
        or ("fp16" if spec.compression == "fp16" else dtype),
        "data_types": {"grad_accum_dtype": ds.grad_accum_dtype or dtype},
        "pipeline": {
            "stages": spec.parallel.pipeline,
            "partition": spec.pipeline.partition,
            "seed_layers": False,
            "activation_checkpoint_interval": spec.pipeline.activation_checkpoint_interval,
            "pipe_partitioned": True,
            "grad_partitioned": True,
        },
        "activation_checkpointing": {
            "partition_activations": spec.activation_checkpointing.partition_activations,
            "cpu_checkpointing": spec.activation_checkpointing.cpu_checkpointing,
        },
        "steps_per_print": spec.log_every_steps,
        "wall_clock_breakdown": False,
        **ds.observability,
    }
    if config["optimizer"] is None:
        del config["optimizer"]  # the script passes its own to deepspeed.initialize
    # DeepSpeed's own scheduler only where its formula is the spec's (toolkit.schedule);
    # otherwise the backend hands DeepSpeed a scheduler to step.
    scheduler = deepspeed_scheduler(spec.schedule, spec.effective_lr(world_size))
    if scheduler is not None:
        config["scheduler"] = scheduler
    return config
