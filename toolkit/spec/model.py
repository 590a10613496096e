"""The typed training spec: `TrainSpec`, its sections (`toolkit.spec.sections`) and its rules.

Building a TrainSpec validates it, whichever way it is built (`TrainSpec.from_dict`,
`load_spec`, or `TrainSpec(...)` in Python): every problem is collected into one SpecError, so
an invalid spec never reaches a renderer.

Cross-section rules (`toolkit.spec.rules`) run from field validators placed on the last section
each rule reads; pydantic hands a validator only the sections declared before it that were
valid (`info.data`), and a rule whose sections are not all there is skipped. That is why the
engine sections (`horovod`) come after `launch` here: what they resolve depends on it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from toolkit.device import DeviceSetting
from toolkit.engines import Backend, Framework, Launcher, controllers_under, engine
from toolkit.spec import parameter_servers, rules
from toolkit.spec.batch import ResolvedBatch, resolve_batch
from toolkit.spec.deepspeed_section import (
    DeepSpeedSpec,
    bias_correction_issues,
    deepspeed_issues,
)
from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.fields import Section, rule_error
from toolkit.spec.hostfile import read_hostfile
from toolkit.spec.hosts import Host
from toolkit.spec.layout import Layout, resolve_layout
from toolkit.spec.run_sections import ScheduleSpec, TimeoutsSpec
from toolkit.spec.sections import (
    ActivationCheckpointingSpec,
    BatchSpec,
    CheckpointSpec,
    Compression,
    DdpSpec,
    FsdpSpec,
    HorovodSpec,
    LaunchSpec,
    LossScalingSpec,
    OptimizerSpec,
    ParallelSpec,
    PipelineSpec,
    TfSpec,
    ZeroSpec,
)
from toolkit.spec.translate import issues_from

LrScaling = Literal["none", "linear"]
Precision = Literal["fp32", "fp16", "bf16"]
StepLoss = Literal["local", "global"]


class TrainSpec(Section):
    """One training job for any engine. Constructing it validates it (raises SpecError)."""

    backend: Backend = Field(
        default="ddp", description="Engine: ddp, fsdp, horovod, deepspeed or tf."
    )
    framework: Framework | None = Field(
        default=None,
        description="torch or tensorflow; null = implied by backend (tf: tensorflow, others: "
        "torch).",
    )
    seed: int = Field(
        default=42,
        ge=0,
        lt=2**32,
        description="Seed for parameters, data order and dropout on every rank.",
    )
    batch: BatchSpec = Field(
        default_factory=BatchSpec,
        description="Global, micro and accumulation batch sizes (any two given).",
    )
    optimizer: OptimizerSpec = Field(
        default_factory=OptimizerSpec, description="Optimizer and its constants."
    )
    lr_scaling: LrScaling = Field(
        default="none",
        description="none, or linear: lr * data-parallel ranks (Horovod's rule), applied in every "
        "engine.",
    )
    clip_grad_norm: float = Field(
        default=0.0, ge=0, description="Clip the global gradient norm to this value; 0 = off."
    )
    precision: Precision = Field(
        default="fp32", description="fp32, fp16 (with loss_scaling) or bf16."
    )
    compression: Compression = Field(
        default="none",
        description="Gradients compressed on the wire, by the engine's own means: fp16 or "
        "bf16 casts (DDP's communication hooks, Horovod's Compression.fp16), powersgd (DDP's "
        "PowerSGD hook, rank in ddp.powersgd_rank). Lossy: changes the math. onebit_adam "
        "(DeepSpeed's 1-bit Adam) is refused: DeepSpeed 0.19 removed it, and it ran on GPUs "
        "only.",
    )
    loss_scaling: LossScalingSpec = Field(
        default_factory=LossScalingSpec, description="fp16 loss-scaling settings."
    )
    device: DeviceSetting = Field(
        default="auto",
        description="auto, cpu or cuda. auto: CUDA where the host shows a GPU, else the CPU. "
        "Under CUDA each rank trains on cuda:<local rank> (one GPU per rank) and the torch "
        "engines communicate over NCCL; on the CPU over Gloo.",
    )
    zero: ZeroSpec = Field(
        default_factory=ZeroSpec, validate_default=True, description="DeepSpeed ZeRO settings."
    )
    pipeline: PipelineSpec = Field(
        default_factory=PipelineSpec,
        validate_default=True,
        description="How the pipeline engine partitions and recomputes layers.",
    )
    parallel: ParallelSpec = Field(
        default_factory=ParallelSpec,
        validate_default=True,
        description="The layout of the ranks: data x pipeline x tensor, FSDP's replicate x "
        "shard, and the tensor-parallel plan.",
    )
    tf: TfSpec = Field(default_factory=TfSpec, description="tf.distribute settings.")
    ddp: DdpSpec = Field(
        default_factory=DdpSpec, description="PyTorch DistributedDataParallel settings."
    )
    deepspeed: DeepSpeedSpec = Field(
        default_factory=DeepSpeedSpec,
        validate_default=True,
        description="DeepSpeed-only settings, named as in ds_config.json.",
    )
    launch: LaunchSpec = Field(
        default_factory=LaunchSpec, validate_default=True, description="Launcher, processes, hosts."
    )
    horovod: HorovodSpec = Field(
        default_factory=HorovodSpec, validate_default=True, description="Horovod settings."
    )
    fsdp: FsdpSpec = Field(
        default_factory=FsdpSpec,
        validate_default=True,
        description="PyTorch FSDP2 (fully_shard) settings.",
    )
    activation_checkpointing: ActivationCheckpointingSpec = Field(
        default_factory=ActivationCheckpointingSpec,
        validate_default=True,
        description="Activations recomputed in the backward pass instead of kept.",
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, validate_default=True, description="Checkpointing."
    )
    schedule: ScheduleSpec = Field(
        default_factory=ScheduleSpec,
        description="Learning-rate schedule over optimizer steps (warmup, decay).",
    )
    timeouts: TimeoutsSpec = Field(
        default_factory=TimeoutsSpec,
        description="How long a job waits on a dead or stalled rank before it ends.",
    )
    log_every_steps: int = Field(
        default=100, ge=1, description="Progress lines every N steps (DeepSpeed's steps_per_print)."
    )
    step_loss: StepLoss = Field(
        default="local",
        description="What run.train_step returns: local = the mean loss over this process's "
        "micro-batches, with no communication (what each engine's own step returns); global = "
        "the mean over the whole global batch, one all-reduce per step, so that per-step losses "
        "compare across engines and world sizes. The pipeline engine's step returns the global "
        "mean either way (DeepSpeed's train_batch reduces it).",
    )

    @classmethod
    def spec_error(cls, error: ValidationError, data: Any, context: Any) -> SpecError:
        """Every issue, in the order their sections were given, values shown as written."""
        written = context.get("written") if isinstance(context, dict) else None
        issues, more = issues_from(error, cls, written)
        order = (
            {str(key): index for index, key in enumerate(data)} if isinstance(data, dict) else {}
        )

        def position(issue: SpecIssue) -> int:
            section = issue.path.split(".", 1)[0].split("[", 1)[0]
            return order.get(section, len(order))

        return SpecError(sorted(issues, key=position), more=more)

    # -- cross-section rules: each on the last section it reads -------------------------------

    @field_validator("framework")
    @classmethod
    def _framework_runs_on_backend(cls, framework: str | None, info: ValidationInfo) -> Any:
        if "backend" in info.data:
            _raise(rules.framework_issues(framework, info.data["backend"]))
        return framework

    @field_validator("optimizer")
    @classmethod
    def _optimizer_runs_on_backend(cls, optimizer: OptimizerSpec, info: ValidationInfo) -> Any:
        if _have(info, "backend"):
            _raise(bias_correction_issues(optimizer.bias_correction, info.data["backend"]))
        return optimizer

    @field_validator("deepspeed")
    @classmethod
    def _deepspeed_settings(cls, section: DeepSpeedSpec, info: ValidationInfo) -> Any:
        data = info.data
        if _have(info, "backend", "precision"):
            _raise(deepspeed_issues(section, data["backend"], data["precision"]))
        if _have(info, "compression"):
            _raise(rules.communication_dtype_issues(section, data["compression"]))
        if _have(info, "zero", "clip_grad_norm", "precision"):
            accumulate = section.grad_accum_dtype
            _raise(
                rules.grad_norm_issues(
                    data["zero"], data["clip_grad_norm"], data["precision"], accumulate
                )
            )
        return section

    @field_validator("zero")
    @classmethod
    def _zero_rules(cls, zero: ZeroSpec, info: ValidationInfo) -> ZeroSpec:
        issues: list[SpecIssue] = []
        if _have(info, "backend"):
            issues += rules.zero_issues(zero, info.data["backend"])
        if _have(info, "optimizer"):
            issues += rules.offload_issues(zero, info.data["optimizer"])
        _raise(issues)
        return zero

    @field_validator("parallel")
    @classmethod
    def _parallel_rules(cls, parallel: ParallelSpec, info: ValidationInfo) -> ParallelSpec:
        if _have(info, "pipeline"):
            _raise(rules.stages_issues(parallel, info.data["pipeline"]))
            parallel = rules.with_pipeline_stages(parallel, info.data["pipeline"])
        if _have(info, "backend", "zero"):
            _raise(rules.layout_issues(parallel, info.data["backend"], info.data["zero"]))
        return parallel

    @field_validator("tf")
    @classmethod
    def _tf_rules(cls, tf: TfSpec, info: ValidationInfo) -> TfSpec:
        data = info.data
        if _have(info, "device"):
            _raise(rules.tf_device_issues(tf, data["device"]))
        if _have(info, "backend", "precision"):
            _raise(
                parameter_servers.role_issues(
                    tf, data["backend"], data.get("framework"), data["precision"]
                )
            )
        return tf

    @field_validator("launch", mode="before")
    @classmethod
    def _read_hostfile(cls, launch: Any, info: ValidationInfo) -> Any:
        return read_hostfile(launch, info.context)

    @field_validator("launch")
    @classmethod
    def _launch_rules(cls, launch: LaunchSpec, info: ValidationInfo) -> LaunchSpec:
        if not _have(info, "backend"):
            return launch
        backend, framework = info.data["backend"], info.data.get("framework")
        issues = list(rules.launch_issues(launch, backend, framework))
        issues += rules.port_issues(launch, backend, framework, info.data)
        if _have(info, "device"):
            issues += rules.gpu_issues(launch, info.data["device"])
        if _have(info, "batch", "parallel", "tf"):
            data = info.data
            issues += rules.world_issues(
                launch, backend, framework, data["batch"], data["parallel"], data["tf"]
            )
            issues += rules.elastic_issues(launch, data["batch"])
        _raise(issues)
        return launch

    @field_validator("horovod")
    @classmethod
    def _horovod_follows_launcher(cls, horovod: HorovodSpec, info: ValidationInfo) -> HorovodSpec:
        if not _have(info, "backend", "launch"):
            return horovod
        backend, framework = info.data["backend"], info.data.get("framework")
        launch = info.data["launch"]
        _raise(rules.horovod_issues(horovod, backend, framework, launch))
        launcher = rules.launcher_of(backend, framework, launch)
        return horovod.with_launcher(controllers_under(launcher)[0])

    @field_validator("checkpoint")
    @classmethod
    def _restarts_resume(cls, checkpoint: CheckpointSpec, info: ValidationInfo) -> Any:
        if _have(info, "launch"):
            _raise(rules.restart_issues(info.data["launch"], checkpoint))
        if _have(info, "ddp"):
            _raise(rules.local_sgd_checkpoint_issues(info.data["ddp"], checkpoint))
        if _have(info, "tf"):
            _raise(parameter_servers.checkpoint_issues(info.data["tf"], checkpoint))
        return checkpoint

    @field_validator("precision")
    @classmethod
    def _precision_an_engine_runs(cls, precision: str, info: ValidationInfo) -> str:
        if _have(info, "backend"):
            _raise(
                rules.precision_issues(precision, info.data["backend"], info.data.get("framework"))
            )
        return precision

    @field_validator("ddp")
    @classmethod
    def _local_sgd_on_ddp(cls, ddp: DdpSpec, info: ValidationInfo) -> DdpSpec:
        if _have(info, "backend", "compression", "precision"):
            data = info.data
            _raise(
                rules.local_sgd_issues(ddp, data["backend"], data["compression"], data["precision"])
            )
        return ddp

    @field_validator("fsdp")
    @classmethod
    def _fsdp_layout(cls, fsdp: FsdpSpec, info: ValidationInfo) -> FsdpSpec:
        if _have(info, "backend", "device"):
            _raise(rules.fsdp_issues(fsdp, info.data["backend"], info.data["device"]))
        return fsdp

    @field_validator("horovod", mode="after")
    @classmethod
    def _compression_an_engine_runs(cls, horovod: HorovodSpec, info: ValidationInfo) -> HorovodSpec:
        if _have(info, "backend", "compression", "device"):
            data = info.data
            _raise(
                rules.compression_issues(
                    data["compression"],
                    data["backend"],
                    data.get("framework"),
                    horovod,
                    data["device"],
                )
            )
        return horovod

    @field_validator("activation_checkpointing")
    @classmethod
    def _recompute_where_an_engine_does(
        cls, section: ActivationCheckpointingSpec, info: ValidationInfo
    ) -> ActivationCheckpointingSpec:
        if _have(info, "backend", "parallel"):
            data = info.data
            _raise(
                rules.recompute_issues(
                    section, data["backend"], data.get("framework"), data["parallel"]
                )
            )
        return section

    # -- building and writing -----------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: str | None = None) -> TrainSpec:
        """Build from parsed YAML/JSON; unknown keys and wrong types are SpecErrors too.

        `base_dir` anchors a relative `launch.hostfile` (default: the working directory).
        """
        return build_spec(data, base_dir=base_dir)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data with file keys (`batch.global`); from_dict(to_dict()) == self."""
        return self.model_dump(mode="json", by_alias=True)

    # -- resolved values ----------------------------------------------------------------------

    @property
    def wire_compression(self) -> str:
        """The gradient compression in effect: `compression`, else Horovod's earlier spelling
        of it (`horovod.compression`)."""
        return self.compression if self.compression != "none" else self.horovod.compression

    @property
    def parameter_server(self) -> bool:
        """tf.strategy parameter_server: TensorFlow's ParameterServerStrategy runs the job."""
        return parameter_servers.parameter_servers(self.tf)

    @property
    def framework_name(self) -> Framework:
        """The framework, resolved from the backend when not given."""
        return self.framework or engine(self.backend).framework

    @property
    def launcher(self) -> Launcher:
        """The launcher, resolved from the backend when not given."""
        return rules.launcher_of(self.backend, self.framework, self.launch)

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Parsed hosts; empty means this machine."""
        return rules.hosts_of(self.launch)

    @property
    def fixed_world_size(self) -> int | None:
        """Processes the spec fixes (launch.np, else the hosts' slots); None = the launcher's."""
        return rules.fixed_world_size(self.launch)

    @property
    def world_size(self) -> int:
        """Processes in the job: launch.np, else the hosts' slots, else 1."""
        return self.fixed_world_size or 1

    @property
    def master_addr(self) -> str:
        """Rendezvous address: launch.master_addr, else the first host, else 127.0.0.1."""
        if self.launch.master_addr:
            return self.launch.master_addr
        return self.hosts[0].name if self.hosts else "127.0.0.1"

    @property
    def computes_grad_norm(self) -> bool:
        """DeepSpeed's `zero_optimization.compute_grad_norm`: zero.compute_grad_norm, else
        false wherever DeepSpeed can skip the norm (`rules.grad_norm_obstacle`)."""
        if self.zero.compute_grad_norm is not None:
            return self.zero.compute_grad_norm
        accumulate = self.deepspeed.grad_accum_dtype
        obstacle = rules.grad_norm_obstacle(
            self.zero, self.clip_grad_norm, self.precision, accumulate
        )
        return obstacle is not None

    def replicas_per_process(self, world_size: int | None = None) -> int:
        """Data-parallel replicas inside one process: tf.local_devices for a one-process
        tf job (MirroredStrategy), else 1."""
        world = self.world_size if world_size is None else world_size
        return rules.replicas_per_process(self.backend, self.framework, self.tf, world)

    def batch_for(self, world_size: int | None = None) -> ResolvedBatch:
        """The batch triple for `world_size` processes (default: this spec's); SpecError if
        impossible. MirroredStrategy's replicas in one process count as data-parallel ranks."""
        world = self.world_size if world_size is None else world_size
        replicas = parameter_servers.data_replicas(self.tf, world, self.replicas_per_process(world))
        return resolve_batch(self.batch, replicas, self.parallel)

    def layout_for(self, world_size: int | None = None) -> Layout:
        """The parallel layout over `world_size` processes (default: this spec's); SpecError
        when `parallel` does not fit it."""
        world = self.world_size if world_size is None else world_size
        return resolve_layout(self.parallel, world)

    def effective_lr(self, world_size: int | None = None) -> float:
        """The learning rate every engine must use, after `lr_scaling`."""
        if self.lr_scaling == "linear":
            return self.optimizer.lr * self.batch_for(world_size).dp
        return self.optimizer.lr


def _have(info: ValidationInfo, *sections: str) -> bool:
    """True when every one of `sections` was valid (a rule reading them may run)."""
    return all(name in info.data for name in sections)


def _raise(issues: Iterable[SpecIssue]) -> None:
    found = list(issues)
    if found:
        raise rule_error(found)


def build_spec(
    data: Any, *, base_dir: str | None = None, written: Mapping[str, str] | None = None
) -> TrainSpec:
    """Validate plain data into a TrainSpec; every problem comes back in one SpecError.

    `written` maps field paths to the text the user wrote there (`Document.written`), so
    values are shown as written.
    """
    if isinstance(data, Mapping) and not isinstance(data, dict):
        data = dict(data)
    if not isinstance(data, dict):
        raise SpecError.single(
            "spec",
            data,
            "must be a mapping of sections (backend, batch, optimizer, ...)",
            hint="a spec is a YAML or JSON mapping, e.g. backend: ddp",
        )
    context = {"base_dir": base_dir or os.getcwd(), "written": written or {}}
    return TrainSpec.model_validate(data, context=context)
