"""The sections of a training spec: one frozen pydantic model each, a description on every field.

Field names are the spec file's keys, except where a key is a Python keyword (`batch.global`
is `BatchSpec.global_`, read and written by its alias). A `None` default means "implied by
another field"; the `TrainSpec` properties resolve it, so a section holds exactly what the user
wrote and `to_dict` round-trips it.

Rules inside one section are field validators that read the fields declared before them
(`info.data` holds only fields that were valid), so a rule never runs on a value that already
failed its own check. Rules across sections live on `TrainSpec` (`toolkit.spec.rules`).

Longer than most modules on purpose: it is the declarative list of every field a spec file
can hold, with its default, bounds and documentation, read top to bottom as the reference.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator

from toolkit.engines import Controller, Launcher
from toolkit.spec.fields import (
    Betas,
    ClassNames,
    Env,
    Hosts,
    Section,
    StrictStage,
    TensorPlan,
    Text,
    ThreadsSetting,
    field_error,
)
from toolkit.spec.hosts import HOST_NAME, MAX_RANKS

OptimizerName = Literal["sgd", "adam", "adamw", "script"]
OffloadDevice = Literal["none", "cpu", "nvme"]
ReduceDtype = Literal["fp32", "bf16"]
HorovodCompression = Literal["none", "fp16"]
HorovodOp = Literal["average", "sum", "adasum"]
Compression = Literal["none", "fp16", "bf16", "powersgd", "onebit_adam"]
TfCommunication = Literal["ring", "nccl", "auto"]
TfInstanceKeys = Literal["unique", "per_trace"]
TfStrategy = Literal["mirrored", "parameter_server"]
MultinodeLauncher = Literal["pdsh", "openmpi", "mvapich", "slurm"]

PathText = Annotated[str, Text("a path", "write a non-empty path on one line")]
SshPath = Annotated[
    str,
    Text(
        "a path without spaces (mpirun and pdsh split ssh options at spaces)",
        "move the file to a path without spaces",
        r"\S+",
    ),
]
INTERFACE = r"[A-Za-z0-9_.:@-]{1,15}"
DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
SLURM_TIME = r"(?:[0-9]+-)?[0-9]+(?::[0-9]{1,2}){0,2}"


class BatchSpec(Section):
    """The batch contract: global = micro * accumulation * data-parallel ranks.

    Give any two and the third is derived for the run's data-parallel size. With fewer than
    two, accumulation defaults to 1 (and micro to 1 when nothing is given).
    """

    global_: int | None = Field(
        default=None,
        alias="global",
        ge=1,
        description="Samples per optimizer step, summed over every data-parallel rank.",
    )
    micro: int | None = Field(
        default=None, ge=1, description="Samples per forward/backward pass on one rank."
    )
    accumulation: int | None = Field(
        default=None, ge=1, description="Micro-batches accumulated per optimizer step."
    )


class OptimizerSpec(Section):
    """The optimizer, with every constant that changes the math written out."""

    name: OptimizerName = Field(
        default="adamw",
        description="sgd (torch.optim.SGD), adam (L2 weight decay in the gradient), adamw "
        "(decoupled weight decay), or script: the script passes its own optimizer to "
        "`run.prepare` (a DeepSpeed config without an optimizer section).",
    )
    lr: float = Field(
        default=1e-3,
        gt=0,
        description="Learning rate before `lr_scaling` is applied; with script, only the "
        "schedule's peak.",
    )
    betas: Betas = Field(
        default=(0.9, 0.999), description="Adam/AdamW moment decay rates; unused by sgd."
    )
    eps: float = Field(
        default=1e-8, gt=0, description="Adam/AdamW denominator term; unused by sgd."
    )
    weight_decay: float = Field(
        default=0.0, ge=0, description="L2 penalty (sgd, adam) or decoupled decay (adamw)."
    )
    momentum: float = Field(
        default=0.0, ge=0, description="SGD momentum; must stay 0 for adam and adamw."
    )
    nesterov: bool = Field(default=False, description="SGD Nesterov momentum; needs momentum > 0.")
    bias_correction: bool = Field(
        default=True,
        description="Adam/AdamW bias correction of the moments; false (BERT's Adam) runs on "
        "DeepSpeed only.",
    )

    @field_validator("momentum")
    @classmethod
    def _momentum_is_sgd_only(cls, momentum: float, info: ValidationInfo) -> float:
        name = info.data.get("name")
        if momentum and name is not None and name != "sgd":
            raise field_error(
                f"only sgd uses momentum, not {name}",
                "set betas for adam/adamw, or remove momentum",
            )
        return momentum

    @field_validator("nesterov")
    @classmethod
    def _nesterov_needs_momentum(cls, nesterov: bool, info: ValidationInfo) -> bool:
        name, momentum = info.data.get("name"), info.data.get("momentum")
        if (
            nesterov
            and name is not None
            and momentum is not None
            and (name != "sgd" or momentum <= 0)
        ):
            raise field_error(
                "needs optimizer.name sgd with momentum > 0", "set momentum, or remove nesterov"
            )
        return nesterov

    @field_validator("bias_correction")
    @classmethod
    def _bias_correction_is_adam_only(cls, bias_correction: bool, info: ValidationInfo) -> bool:
        name = info.data.get("name")
        if not bias_correction and name is not None and name not in ("adam", "adamw"):
            raise field_error(
                f"only adam and adamw correct bias, not {name}", "remove bias_correction"
            )
        return bias_correction


class LossScalingSpec(Section):
    """fp16 loss scaling, used only when precision is fp16: DeepSpeed's rule and names, which
    DDP, FSDP and Horovod follow step for step (toolkit.loss_scaling)."""

    loss_scale: float = Field(
        default=0.0, ge=0, description="0 = dynamic loss scaling; any other value is a fixed scale."
    )
    initial_scale_power: int = Field(
        default=16, ge=0, le=63, description="Dynamic scaling starts at 2**initial_scale_power."
    )
    loss_scale_window: int = Field(
        default=1000, ge=1, description="Overflow-free steps before the dynamic scale is doubled."
    )
    hysteresis: int = Field(
        default=2, ge=1, description="Overflows tolerated before the dynamic scale is halved."
    )
    consecutive_hysteresis: bool = Field(
        default=False,
        description="Refill hysteresis on every overflow-free step instead of only at a scale "
        "increase.",
    )
    min_loss_scale: int = Field(default=1, ge=1, description="Lowest dynamic scale.")


REDUCE_BUCKET_ELEMENTS = 1 << 22
"""The toolkit's ZeRO reduce bucket, 16 MiB in fp32, where DeepSpeed's default is 5e8 elements:
ZeRO-1 and 2 allocate the whole bucket again for every backward, which on a CPU is a fresh
mapping whose pages fault in every step (docs/engine-notes.md). 2**22 is what Hugging Face's
"auto" gives a 2048-wide model. Each gradient element is reduced once whichever bucket holds it:
with 2 ranks the sum is the same to the bit; with more a ring all-reduce may add its terms in
another order as bucket boundaries move."""


class ZeroSpec(Section):
    """DeepSpeed ZeRO partitioning; stage 0 is plain data parallelism."""

    stage: StrictStage = Field(
        default=0, description="0 off, 1 optimizer states, 2 + gradients, 3 + parameters."
    )
    offload_optimizer: OffloadDevice = Field(
        default="none",
        description="Keep optimizer states (and run the step) on cpu or nvme; stage 1-3.",
    )
    offload_params: OffloadDevice = Field(
        default="none",
        description="Keep parameters on cpu or nvme between uses; stage 3 only.",
    )
    nvme_path: PathText | None = Field(
        default=None,
        validate_default=True,
        description="Directory on the NVMe device; required when anything is offloaded to nvme.",
    )
    pin_memory: bool = Field(
        default=True, description="Page-locked host memory for offloaded tensors."
    )
    reduce_bucket_size: int = Field(
        default=REDUCE_BUCKET_ELEMENTS,
        ge=1,
        description="Elements reduced at a time. The toolkit's default, 2**22 (16 MiB in fp32), "
        "is below DeepSpeed's 5e8: ZeRO-1 and 2 allocate the whole bucket every backward, on a "
        "CPU a new 2 GB mapping whose touched pages fault in every step; 2**22 stays on the "
        "heap, which keeps it between steps.",
    )
    multi_rank_bucket_allreduce: bool = Field(
        default=False,
        description="Stages 1-2: all-reduce every rank's gradient partitions together (DeepSpeed's "
        "default, true) instead of reducing each partition to the rank that owns it (false): "
        "the owner's sum is the same, and a reduce moves each gradient once where the "
        "all-reduce also copies every sum back to every rank.",
    )
    compute_grad_norm: bool | None = Field(
        default=None,
        description="Stages 1-2: compute the global gradient norm at every step (DeepSpeed's "
        "default, true). Only clipping needs it; false saves its pass over the gradients and its "
        "all-reduce. It also decides what an fp32 step with inf or NaN gradients does: with the "
        "norm, ZeRO-1/2 skip that step; without it they apply it, as DDP, Horovod, TensorFlow and "
        "ZeRO-0/3 do. null = false wherever DeepSpeed allows it (stage 1 or 2, clip_grad_norm 0, "
        "no optimizer offload, not bf16 ZeRO-1 with fp32 gradient accumulation), else true.",
    )
    allgather_bucket_size: int = Field(
        default=500_000_000, ge=1, description="Elements all-gathered at a time (stages 1-2)."
    )
    overlap_comm: bool | None = Field(
        default=None,
        description="Overlap gradient reduction with backward; null = DeepSpeed's rule (true only "
        "at stage 3).",
    )
    contiguous_gradients: bool = Field(
        default=True, description="Copy gradients into one buffer as they are produced."
    )
    sub_group_size: int = Field(
        default=1_000_000_000,
        ge=1,
        description="Elements per group the optimizer steps at a time (DeepSpeed's default).",
    )
    stage3_prefetch_bucket_size: int = Field(
        default=50_000_000, ge=0, description="Stage 3: parameter elements fetched ahead of use."
    )
    stage3_param_persistence_threshold: int = Field(
        default=100_000,
        ge=0,
        description="Stage 3: parameters smaller than this are not partitioned.",
    )
    stage3_max_live_parameters: int = Field(
        default=1_000_000_000, ge=0, description="Stage 3: parameter elements resident per rank."
    )
    stage3_max_reuse_distance: int = Field(
        default=1_000_000_000,
        ge=0,
        description="Stage 3: do not release a parameter reused within this many elements.",
    )
    stage3_gather_16bit_weights_on_model_save: bool = Field(
        default=False, description="Stage 3: gather the full 16-bit weights when saving a model."
    )

    @field_validator("offload_optimizer")
    @classmethod
    def _optimizer_offload_needs_zero(cls, device: str, info: ValidationInfo) -> str:
        if device != "none" and info.data.get("stage") == 0:
            raise field_error("needs zero.stage 1, 2 or 3", "raise zero.stage")
        return device

    @field_validator("offload_params")
    @classmethod
    def _param_offload_needs_stage_3(cls, device: str, info: ValidationInfo) -> str:
        stage = info.data.get("stage")
        if device != "none" and stage is not None and stage != 3:
            raise field_error(
                f"needs zero.stage 3 (stage is {stage})",
                "set zero.stage: 3, or offload_params: none",
            )
        return device

    @field_validator("nvme_path")
    @classmethod
    def _nvme_needs_a_path(cls, path: str | None, info: ValidationInfo) -> str | None:
        devices = (info.data.get("offload_optimizer"), info.data.get("offload_params"))
        if path is None and "nvme" in devices:
            raise field_error(
                "required when offloading to nvme", "give a directory on the NVMe device"
            )
        return path


class PipelineSpec(Section):
    """How DeepSpeed's pipeline engine splits and recomputes the layers; how many stages is
    `parallel.pipeline`."""

    stages: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="The earlier spelling of parallel.pipeline, still read: written alone it "
        "sets parallel.pipeline; written beside it, the two must agree.",
    )
    partition: str = Field(
        default="parameters",
        description="How layers are split: parameters, uniform, or type:REGEX (DeepSpeed's "
        "partition_method).",
    )
    activation_checkpoint_interval: int = Field(
        default=0,
        ge=0,
        description="Checkpoint activations every N layers; 0 = no activation checkpointing.",
    )

    @field_validator("partition")
    @classmethod
    def _partition_method(cls, value: str) -> str:
        if value in ("parameters", "uniform"):
            return value
        regex = value.removeprefix("type:")
        if value.startswith("type:") and regex:
            try:
                re.compile(regex)
                return value
            except (re.error, RecursionError, OverflowError):
                pass
        raise field_error(
            "allowed parameters, uniform, type:REGEX",
            "type:REGEX balances the layers whose class name matches REGEX",
        )


class ParallelSpec(Section):
    """The one layout of the ranks: data x pipeline x tensor = world size, and for FSDP the
    data-parallel ranks split again into replicate x shard. The batch contract is over the
    data-parallel degree; each engine maps the layout to its own groups (a torch DeviceMesh,
    DeepSpeed's pipeline topology)."""

    data: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="Data-parallel degree: the ranks that read different samples; null = the "
        "world size / (pipeline x tensor). Written, the world size must be data x pipeline x "
        "tensor.",
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=MAX_RANKS,
        description="Pipeline stages (DeepSpeed's pipeline engine): each holds a slice of the "
        "layers and passes activations on; 1 = none.",
    )
    tensor: int = Field(
        default=1,
        ge=1,
        le=MAX_RANKS,
        description="Tensor-parallel degree: consecutive ranks that split each planned "
        "module's weights between them (DTensor's parallelize_module) and read the same "
        "samples; 1 = none.",
    )
    replicate: int = Field(
        default=1,
        ge=1,
        le=MAX_RANKS,
        description="FSDP's HSDP: groups that each hold a whole sharded copy of the model, the "
        "data-parallel ranks split into replicate x shard; 1 = one shard group over them all.",
    )
    shard: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="FSDP's shard group size: the ranks one copy of the model is sharded "
        "over; null = data / replicate. Written, data must be replicate x shard.",
    )
    tensor_plan: TensorPlan = Field(
        default_factory=dict,
        description="Module-name patterns (dots between parts, * for any one part, e.g. "
        '"layers.*.mlp.up_proj") -> colwise (output features split) or rowwise (input '
        "features split, the outputs summed); {} = the model's own plan (Hugging Face models' "
        "base_model_tp_plan).",
    )

    @field_validator("shard")
    @classmethod
    def _shards_times_replicas(cls, shard: int | None, info: ValidationInfo) -> int | None:
        data, replicate = info.data.get("data"), info.data.get("replicate")
        if (
            shard is not None
            and data is not None
            and replicate is not None
            and replicate * shard != data
        ):
            raise field_error(
                f"replicate({replicate}) x shard must equal data({data})",
                "leave shard out to derive it, or change replicate or data",
            )
        return shard


class DdpSyncSpec(Section):
    """How often DDP's ranks agree: every step (all-reduced gradients, the default), or local
    SGD (torch's post-local SGD): synchronous for `after` steps, then each rank steps alone on
    its own micro-batches and the ranks' parameters are averaged every `every_steps` steps.
    Local SGD changes the math: between averages each rank's step sees only its share of the
    global batch, and each rank keeps its own optimizer state."""

    every_steps: int = Field(
        default=1,
        ge=1,
        le=1_000_000,
        description="1: every step's gradients are all-reduced. k > 1: local SGD, the "
        "parameters averaged every k steps (PeriodicModelAverager's period).",
    )
    after: int = Field(
        default=0,
        ge=0,
        description="Local SGD: the synchronous steps before it starts (PostLocalSGDState's "
        "start_localSGD_iter, the averager's warmup_steps).",
    )

    @property
    def local(self) -> bool:
        return self.every_steps > 1


class DdpSpec(Section):
    """torch DistributedDataParallel's gradient buckets and how they are summed. The bucket
    settings change no math: the same gradients are divided by the same world size and
    summed, bucket by bucket; with more than 2 ranks the transports add in different orders,
    which changes the rounding only. PowerSGD and local SGD (`sync`) do change it."""

    bucket_cap_mb: float = Field(
        default=25.0,
        gt=0,
        le=1_000_000,
        description="Gradient bucket size in MiB (torch's default, 25): each bucket's "
        "all-reduce starts when its gradients are ready, overlapping the rest of backward.",
    )
    gradient_as_bucket_view: bool = Field(
        default=True,
        description="Gradients are views into the buckets (torch's default is false): no "
        "copy into the bucket before each all-reduce and back after it, and one copy of the "
        "gradients fewer in memory.",
    )

    powersgd_rank: int = Field(
        default=1,
        ge=1,
        description="compression: powersgd: the rank of PowerSGD's low-rank approximation of "
        "each gradient matrix (PowerSGDState.matrix_approximation_rank).",
    )
    powersgd_start_step: int = Field(
        default=2,
        ge=2,
        description="compression: powersgd: the optimizer step from which PowerSGD compresses "
        "(plain all-reduce before it; start_powerSGD_iter).",
    )
    sync: DdpSyncSpec = Field(
        default_factory=DdpSyncSpec,
        description="Every step, or local SGD: {every_steps: k, after: warmup steps}.",
    )


class ActivationCheckpointingSpec(Section):
    """Activations recomputed in the backward pass instead of kept: less memory, the same
    weights. The torch engines run the named modules' forward under a checkpoint (torch's
    non-reentrant `torch.utils.checkpoint`, DeepSpeed's own `deepspeed.checkpointing`); the
    pipeline engine has `pipeline.activation_checkpoint_interval` instead."""

    modules: list[str] = Field(
        default_factory=list,
        description="Classes of the modules whose activations are recomputed (e.g. [GPT2Block], "
        "the model's repeated blocks); [] = none.",
    )
    partition_activations: bool = Field(
        default=False,
        description="DeepSpeed: split the kept activations over the model-parallel ranks.",
    )
    cpu_checkpointing: bool = Field(
        default=False,
        description="DeepSpeed: keep the checkpointed activations in host memory.",
    )


class FsdpSpec(Section):
    """PyTorch FSDP2 (`fully_shard`): which modules are units, when their parameters are
    released, and offload (hybrid sharding is `parallel.replicate`). Parameters, gradients and
    optimizer state are sharded over the ranks of a shard group; the optimizer steps on fp32
    shards whatever the precision (the spec's bf16 computes in bf16, gradients are reduced in
    `reduce_dtype`)."""

    wrap: ClassNames = Field(
        default=(),
        description="Class names of the modules that become FSDP units, each gathered and "
        "released on its own (e.g. [GPT2Block]); [] = the model's repeated blocks: the "
        "modules in its ModuleLists, else an nn.Sequential's children that hold parameters. "
        "The whole model is always the outermost unit.",
    )
    reshard_after_forward: bool = Field(
        default=True,
        description="Free each unit's gathered parameters after its forward and gather them "
        "again in backward (ZeRO-3's memory); false keeps them from forward to backward (one "
        "all-gather fewer per step, ZeRO-2's memory for parameters).",
    )
    offload: OffloadDevice = Field(
        default="none",
        description="cpu: the sharded parameters, gradients and optimizer step live on the "
        "host (CPUOffloadPolicy), for GPU jobs only (FSDP2 needs an accelerator to offload "
        "from); nvme is refused (FSDP has none).",
    )
    reduce_dtype: ReduceDtype = Field(
        default="fp32",
        description="dtype gradients are reduced in under precision bf16 "
        "(MixedPrecisionPolicy.reduce_dtype); fp32, the default, sums bf16 gradients in fp32.",
    )

    @field_validator("offload")
    @classmethod
    def _no_nvme(cls, offload: str) -> str:
        if offload == "nvme":
            raise field_error(
                "none or cpu: FSDP offloads to the host's memory only",
                "use none or cpu, or DeepSpeed's zero.offload_params: nvme",
            )
        return offload


GLOO_CYCLE_TIME_MS = 5.0
HOROVOD_CYCLE_TIME_MS = 1.0
"""Horovod's own default since 0.21."""
GLOO_FUSION_THRESHOLD_MB = 64
MPI_FUSION_THRESHOLD_MB = 1


class HorovodSpec(Section):
    """Horovod's controller, tensor fusion and reduction settings."""

    controller_setting: Controller | None = Field(
        default=None,
        alias="controller",
        description="Who coordinates the ranks: gloo or mpi; null = the launcher's: mpi under "
        "mpirun and srun; under horovodrun what horovodrun itself picks, mpi when Horovod was "
        "built with MPI, else gloo.",
    )
    fusion_threshold_mb: int | None = Field(
        default=None,
        ge=0,
        description="Tensor fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD is bytes): "
        "gradients smaller than it are copied into it and reduced together, a larger one is "
        "reduced alone, in place; 0 turns fusion off. null = 1 under the MPI controller, 64 "
        "under Gloo (Horovod's own is 128).",
    )
    cycle_time_ms: float | None = Field(
        default=None,
        ge=0,
        description="Milliseconds between fusion cycles; null = 5 under the Gloo controller, "
        "1 (Horovod's own) under MPI.",
    )
    mpi_yield_when_idle: bool = Field(
        default=True,
        description="Under the MPI controller, let Open MPI's waits give the core away "
        "(OMPI_MCA_mpi_yield_when_idle); Open MPI's own default yields only when a host has "
        "more ranks than slots. Horovod's background thread waits in MPI every cycle, and "
        "without it spins a core the rank's compute needs.",
    )
    cache_capacity: int = Field(
        default=1024, ge=0, description="Response cache entries; 0 disables the cache."
    )
    hierarchical_allreduce: bool = Field(
        default=False, description="Reduce within each host first, then across hosts."
    )
    hierarchical_allgather: bool = Field(
        default=False, description="Gather within each host first, then across hosts."
    )
    compression: HorovodCompression = Field(
        default="none",
        description="Compress gradients on the wire: none or fp16 (changes the math).",
    )
    op: HorovodOp = Field(
        default="average",
        description="Gradient reduction: average (what every other engine does), sum or adasum.",
    )
    timeline: Annotated[str, Text("a file name", "write a file name")] | None = Field(
        default=None, description="Write a Horovod timeline to this file."
    )
    autotune: bool = Field(
        default=False, description="Let Horovod tune fusion and cycle time while training."
    )

    _launcher_controller: Controller = PrivateAttr("gloo")
    """The controller the spec's launcher implies; set by TrainSpec (`with_launcher`). Under
    horovodrun that depends on the Horovod build of the machine that launches: the spec says
    gloo (horovodrun's choice for a Horovod without MPI), and `toolkit launch` and
    `toolkit config` resolve it for their machine (toolkit.launch.machine_settings)."""

    @property
    def controller(self) -> Controller:
        """The controller in effect: the one written, else the one the launcher implies."""
        return self.controller_setting or self._launcher_controller

    @property
    def cycle_time(self) -> float:
        """The cycle time in effect: the one written, else the controller's.

        Each cycle the Gloo controller negotiates with a Gloo collective over TCP, and with one
        core per rank those wake-ups take turns with the compute, so Gloo gets a longer cycle;
        MPI's controller negotiates in shared memory and keeps Horovod's own. Either way each
        rank sums the same gradients (measurements: docs/engine-notes.md, Horovod).
        """
        if self.cycle_time_ms is not None:
            return self.cycle_time_ms
        return GLOO_CYCLE_TIME_MS if self.controller == "gloo" else HOROVOD_CYCLE_TIME_MS

    @property
    def fusion_threshold(self) -> int:
        """The fusion buffer in effect, in MiB: the one written, else the controller's.

        Horovod copies the gradients it fuses into its buffer and back out after the reduction,
        while a tensor reduced alone is reduced where it lies (`MPIAllreduce::Execute`,
        horovod/common/ops). Under MPI, whose calls are cheap, a small buffer lets the large
        gradients skip both copies while the small ones still fuse. Under Gloo every reduction
        is a round of TCP messages and its single-tensor path still copies once, so Gloo keeps
        a buffer large enough to fuse everything (docs/engine-notes.md, Horovod). The sums are
        the same either way; with more than 2 ranks Open MPI may pick another algorithm for a
        smaller message, which changes the rounding only.
        """
        if self.fusion_threshold_mb is not None:
            return self.fusion_threshold_mb
        return GLOO_FUSION_THRESHOLD_MB if self.controller == "gloo" else MPI_FUSION_THRESHOLD_MB

    def running(self, controller: Controller) -> HorovodSpec:
        """A copy under `controller`, the one a launcher started the ranks for."""
        return self.model_copy(update={"controller_setting": controller})

    def with_launcher(self, controller: Controller) -> HorovodSpec:
        """A copy whose unset controller follows a launcher that implies `controller`."""
        copy = self.model_copy()
        copy._launcher_controller = controller
        return copy


class TfSpec(Section):
    """tf.distribute settings: MultiWorkerMirroredStrategy, or MirroredStrategy in one process,
    or ParameterServerStrategy."""

    strategy: TfStrategy = Field(
        default="mirrored",
        description="mirrored: synchronous data parallelism (MultiWorkerMirroredStrategy "
        "across processes, MirroredStrategy in one). parameter_server: TensorFlow's "
        "ParameterServerStrategy, asynchronous: rank 0 is the chief, which runs the training "
        "loop and reads every global batch, the last tf.ps ranks hold the variables, and the "
        "ranks between are workers, each applying its own steps' gradients as it finishes "
        "them, on weights up to workers - 1 updates old.",
    )
    ps: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Parameter servers under tf.strategy parameter_server: the job's last this "
        "many ranks; variables are placed whole, round-robin over them.",
    )

    communication: TfCommunication = Field(
        default="ring",
        description="Collective implementation: ring (gRPC, works on CPU), nccl (GPUs only) or "
        "auto (TensorFlow's choice: NCCL between GPUs). In one process under CUDA: nccl is "
        "NcclAllReduce, auto TensorFlow's default, ring a reduction onto one device.",
    )
    instance_keys: TfInstanceKeys = Field(
        default="unique",
        description="MultiWorker's collective instance keys. unique (TensorFlow's default): a "
        "new key for every collective call, which each worker resolves with its peers and "
        "keeps for the rest of the job, so memory grows every step (native MultiWorker "
        "scripts alike). per_trace: one key per collective of each traced step, resolved "
        "once: no growth and no resolution per step; every worker must then trace its steps "
        "at the same points (the same shapes on every rank), or their collectives do not "
        "meet and the job ends at timeouts.collective_s. Changes no value.",
    )
    port: int = Field(
        default=12345,
        ge=1,
        le=65535,
        description="Port of worker 0; worker i listens at port + i on its host (unique "
        "across the job, so workers on hosts that share a machine never collide).",
    )
    local_devices: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Replicas in one process (MirroredStrategy over this many logical CPU "
        "devices, or the first this many GPUs under CUDA), used when the job has one process; "
        "data-parallel replicas = processes * local_devices.",
    )


class SshSpec(Section):
    """How `toolkit launch` and the launchers reach other hosts by ssh. Each value is passed to
    every launcher in its own form (mpirun's plm_rsh_args, horovodrun's --ssh-port and
    --ssh-identity-file, pdsh's PDSH_SSH_ARGS_APPEND, the toolkit's own ssh for torchrun and
    the local launcher); null leaves it to ssh's own configuration (~/.ssh/config)."""

    port: int | None = Field(default=None, ge=1, le=65535, description="sshd port on the hosts.")
    identity_file: SshPath | None = Field(
        default=None, description="Private key (ssh -i); relative to the working directory."
    )
    config_file: SshPath | None = Field(
        default=None,
        description="ssh client configuration (ssh -F), e.g. for host keys; not honoured by "
        "horovodrun, which has no such option.",
    )

    def options(self) -> list[str]:
        """ssh's own options for these settings, in the order ssh reads them."""
        options = ["-F", self.config_file] if self.config_file else []
        if self.port is not None:
            options += ["-p", str(self.port)]
        if self.identity_file:
            options += ["-i", self.identity_file]
        return options


class LaunchSpec(Section):
    """How the ranks are started: launcher, process count and where they run."""

    launcher: Launcher | None = Field(
        default=None,
        description="horovodrun, mpirun, deepspeed, torchrun, srun or local; null = the "
        "backend's usual one.",
    )
    np: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="Processes (the world size); null = the hosts' slots summed, or the "
        "launcher's count at run time.",
    )
    hosts: Hosts = Field(
        default=(), description='Hosts as "name:slots" (slots default 1); [] = this machine.'
    )
    gpus_per_host: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="GPUs each host gives the job when it trains on CUDA, one rank per GPU: "
        "launch.np defaults to it on one host, and Slurm's --gpus-per-node, the MPIJob's GPU "
        "limits and the deepspeed launcher's --num_gpus are rendered from it; null = the ranks "
        "per host, and for `toolkit launch` on one host every GPU it shows.",
    )
    hostfile: PathText | None = Field(
        default=None,
        description='A hostfile ("name slots=N" or "name:N" per line), read when the spec is '
        "loaded, relative to the spec file.",
    )
    master_addr: (
        Annotated[
            str, Text("a host name or IPv4 address", "letters, digits, dots, dashes", HOST_NAME)
        ]
        | None
    ) = Field(
        default=None,
        description="Rendezvous address; null = the first host, or 127.0.0.1 without hosts.",
    )
    master_port: int = Field(
        default=29500,
        ge=1,
        le=65535,
        description="Rendezvous port (torch.distributed, DeepSpeed, torchrun).",
    )
    ssh: SshSpec = Field(
        default_factory=SshSpec, description="How ranks on other hosts are reached by ssh."
    )
    max_restarts: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Times `toolkit launch` starts the whole job again after a rank fails, "
        "stalls or loses its host; each start resumes from checkpoint.dir's newest checkpoint "
        "that verifies. 0 = a fault ends the job.",
    )
    min_np: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANKS,
        description="Fewest ranks a restarted job may go on with: before each restart the "
        "hosts are asked again, and the job continues on those that answer when their slots "
        "hold at least min_np ranks, resuming at that world size with the global batch held "
        "(accumulation follows); null = every host, every time.",
    )
    interface: (
        Annotated[str, Text("a network interface name", "e.g. eth0 or lo", INTERFACE)] | None
    ) = Field(
        default=None,
        description="Network interface for traffic between ranks on several hosts "
        "(mpirun btl/oob_tcp_if_include, horovodrun --network-interfaces, "
        "GLOO_SOCKET_IFNAME); null = each engine's own choice.",
    )
    multinode_launcher: MultinodeLauncher = Field(
        default="pdsh",
        description="How the deepspeed launcher reaches other hosts (its --launcher).",
    )
    pass_local_rank: bool = Field(
        default=True,
        description="deepspeed launcher: pass --local_rank=N to the script, as native deepspeed "
        "does; false adds --no_local_rank (ranks read LOCAL_RANK).",
    )
    python: Annotated[str, Text("a command", "write the interpreter's path")] | None = Field(
        default=None, description="Interpreter for .py scripts; null = the one running the toolkit."
    )
    threads_per_rank: ThreadsSetting = Field(
        default="auto",
        description="Compute threads of each rank (OMP_NUM_THREADS, torch's and TensorFlow's "
        "thread pools, Slurm cpus-per-task); auto = the cores a rank may use divided by the "
        "ranks on its host, at least 1.",
    )
    bind_cores: bool = Field(
        default=False,
        description="Bind each rank, every thread of it, to an even share of its host's "
        "cores (its local rank's slice, inside any binding the launcher or Slurm already "
        "made); false = the kernel moves threads between cores as it likes, the engines' and "
        "launchers' own choice here (the toolkit starts mpirun with --bind-to none). Changes "
        "no value.",
    )
    env: Env = Field(
        default_factory=dict, description="Extra environment variables for every rank."
    )
    image: Annotated[str, Text("an image name", "no spaces", r"\S+")] = Field(
        default="toolkit:latest", description="Container image for cluster manifests (MPIJob)."
    )
    job_name: Annotated[
        str,
        Text(
            "a DNS-1123 label (lower-case letters, digits and -, at most 63)",
            "write e.g. train-run-1",
            DNS_LABEL,
        ),
    ] = Field(
        default="toolkit-train", description="Job name for Slurm and Kubernetes (a DNS-1123 label)."
    )
    partition: (
        Annotated[
            str, Text("a Slurm partition name", "letters, digits, _, . and -", r"[A-Za-z0-9_.-]+")
        ]
        | None
    ) = Field(default=None, description="Slurm partition; null = the cluster's default.")
    time_limit: Annotated[
        str,
        Text(
            "a Slurm time limit, [days-]hours[:minutes[:seconds]]",
            'write e.g. "02:00:00"',
            SLURM_TIME,
        ),
    ] = Field(default="01:00:00", description="Slurm time limit ([days-]hours:minutes:seconds).")


class CheckpointSpec(Section):
    """Where and how often checkpoints are written, and whether a run resumes from them.

    `dir` is what switches checkpointing on: with it, `run.save()` writes there, the run saves
    every `every_steps` optimizer steps, and a new launch resumes from its `latest` checkpoint
    (unless `resume: never`). Without it nothing is saved or resumed behind the user's back.
    """

    dir: PathText | None = Field(
        default=None,
        description="Directory of checkpoints (step-N directories and a `latest` pointer); "
        "null = no periodic saves and no automatic resume.",
    )
    every_steps: int = Field(
        default=0, ge=0, description="Save every N optimizer steps into `dir`; 0 = never."
    )
    keep: int = Field(default=3, ge=0, description="Newest checkpoints kept; 0 = keep all.")
    resume: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: when `dir` holds a complete checkpoint, continue from its `latest` "
        "(weights, optimizer, schedule, RNG and data position); never: start afresh.",
    )
    save_on_signal: bool = Field(
        default=False,
        description="SIGTERM or SIGUSR1 to a rank or to `toolkit launch` (Slurm's --signal, a "
        "Kubernetes eviction, a scheduler's preemption) saves a checkpoint at the next step "
        "boundary on every rank, and the job ends with status 75 (preempted); costs one small "
        "all-reduce per step. false = a signal stops the job as it is.",
    )
    preempt_s: int = Field(
        default=120,
        ge=10,
        le=86400,
        description="Seconds a signalled job has to finish its step and save: sbatch asks "
        "Slurm to signal this long before the job's end (--signal=USR1@N), and `toolkit "
        "launch` stops ranks that take longer.",
    )

    async_: bool = Field(
        default=False,
        alias="async",
        description="Write the every_steps saves in a background thread: the step copies its "
        "state to host memory and training goes on while the files are written and committed; "
        "at most one save in flight. run.save() and a preemption's save stay synchronous.",
    )
    save_failure: Literal["stop", "continue"] = Field(
        default="stop",
        description="When an every_steps save cannot be written (disk full, permissions): "
        "stop ends the job with status 74 and the error in one line; continue says so in one "
        "line and trains on, `latest` staying on the previous checkpoint. Either way nothing "
        "saved before is lost.",
    )

    @field_validator("every_steps", "save_on_signal")
    @classmethod
    def _saves_need_a_dir(cls, value: int | bool, info: ValidationInfo) -> int | bool:
        if value and "dir" in info.data and info.data["dir"] is None:
            example = (
                "every_steps: 100" if info.field_name == "every_steps" else "save_on_signal: true"
            )
            raise field_error(
                "needs checkpoint.dir (where to save)",
                f"set checkpoint.dir, e.g. checkpoint: {{dir: ckpt, {example}}}",
            )
        return value

    @field_validator("async_")
    @classmethod
    def _async_needs_periodic_saves(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("every_steps") == 0:
            raise field_error(
                "applies to the every_steps saves, and every_steps is 0",
                "set checkpoint.every_steps, e.g. checkpoint: {dir: ckpt, every_steps: 100, "
                "async: true}, or remove async",
            )
        return value
