"""The typed training spec: one frozen dataclass per section, a docstring under every field.

Field names are the spec file's keys, except where a key is a Python keyword (`batch.global`
is `BatchSpec.global_`; the file key is kept in the field's metadata). A `None` default means
"implied by another field"; the `TrainSpec` properties (`framework_name`, `launcher`,
`world_size`, `hosts`, ...) give the resolved values, so the dataclasses hold exactly what the
user wrote and `to_dict` round-trips it.

Building a `TrainSpec` validates it: every problem is collected into one `SpecError`
(see `toolkit.spec.validate`), so an invalid spec never reaches a renderer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from toolkit.engines import Backend, Framework, Launcher, engine
from toolkit.spec.constraints import metadata, number, text
from toolkit.spec.errors import SpecIssue
from toolkit.spec.hosts import HOST_NAME, MAX_RANKS, Host, check_host_list, parse_host

OptimizerName = Literal["sgd", "adam", "adamw"]
LrScaling = Literal["none", "linear"]
Precision = Literal["fp32", "fp16", "bf16"]
OffloadDevice = Literal["none", "cpu", "nvme"]
ZeroStage = Literal[0, 1, 2, 3]
HorovodController = Literal["gloo", "mpi"]
HorovodCompression = Literal["none", "fp16"]
HorovodOp = Literal["average", "sum", "adasum"]
TfCommunication = Literal["ring", "nccl", "auto"]
MultinodeLauncher = Literal["pdsh", "openmpi", "mvapich", "slurm"]


HOST_WHAT = "a host name or IPv4 address (letters, digits, dots, dashes)"
DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
DNS_WHAT = "a DNS-1123 label (lower-case letters, digits and -, at most 63)"
SLURM_TIME = r"(?:\d+-)?\d+(?::\d{1,2}){0,2}"
SLURM_TIME_WHAT = "a Slurm time limit, [days-]hours[:minutes[:seconds]]"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: dict[str, str], path: str) -> list[SpecIssue]:
    """Environment variable names are identifiers; values are one line."""
    return [
        SpecIssue(
            path=f"{path}.{name}",
            value=value,
            allowed="names are letters, digits and _; values have no control characters",
        )
        for name, value in env.items()
        if not _ENV_NAME.fullmatch(name) or any(ord(char) < 32 for char in value)
    ]


def partition_method() -> dict[str, Any]:
    """DeepSpeed's PipelineModule partition_method: parameters, uniform or type:REGEX."""

    def check(value: str, path: str) -> list[SpecIssue]:
        if value in ("parameters", "uniform"):
            return []
        regex = value.removeprefix("type:")
        if value.startswith("type:") and regex:
            try:
                re.compile(regex)
                return []
            except re.error:
                pass
        return [
            SpecIssue(
                path=path,
                value=value,
                allowed="allowed parameters, uniform, type:REGEX",
                hint="type:REGEX balances the layers whose class name matches REGEX",
            )
        ]

    return metadata(check)


def key(name: str) -> dict[str, str]:
    """Field metadata naming the spec-file key of a field whose name is a Python keyword."""
    return {"key": name}


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """The batch contract: global = micro * accumulation * data-parallel ranks.

    Give any two and the third is derived for the run's data-parallel size. With fewer than
    two, accumulation defaults to 1 (and micro to 1 when nothing is given).
    """

    global_: int | None = field(default=None, metadata={**number(ge=1), **key("global")})
    """Samples per optimizer step, summed over every data-parallel rank."""
    micro: int | None = field(default=None, metadata=number(ge=1))
    """Samples per forward/backward pass on one rank."""
    accumulation: int | None = field(default=None, metadata=number(ge=1))
    """Micro-batches accumulated per optimizer step."""


@dataclass(frozen=True, kw_only=True)
class ResolvedBatch:
    """The batch triple for one data-parallel size; always global = micro * accumulation * dp."""

    global_: int
    """Samples per optimizer step over all data-parallel ranks."""
    micro: int
    """Samples per forward/backward pass on one rank."""
    accumulation: int
    """Micro-batches per optimizer step."""
    dp: int
    """Data-parallel ranks: world size / pipeline stages."""


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """The optimizer, with every constant that changes the math written out."""

    name: OptimizerName = "adamw"
    """sgd (torch.optim.SGD), adam (L2 weight decay in the gradient) or adamw (decoupled)."""
    lr: float = field(default=1e-3, metadata=number(gt=0))
    """Learning rate before `lr_scaling` is applied."""
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=number(ge=0, lt=1))
    """Adam/AdamW moment decay rates; unused by sgd."""
    eps: float = field(default=1e-8, metadata=number(gt=0))
    """Adam/AdamW denominator term; unused by sgd."""
    weight_decay: float = field(default=0.0, metadata=number(ge=0))
    """L2 penalty (sgd, adam) or decoupled decay (adamw)."""
    momentum: float = field(default=0.0, metadata=number(ge=0))
    """SGD momentum; must stay 0 for adam and adamw."""
    nesterov: bool = False
    """SGD Nesterov momentum; needs momentum > 0."""


@dataclass(frozen=True, kw_only=True)
class LossScalingSpec:
    """fp16 loss scaling, used only when precision is fp16 (names follow DeepSpeed's)."""

    loss_scale: float = field(default=0.0, metadata=number(ge=0, hint="0 = dynamic"))
    """0 = dynamic loss scaling; any other value is a fixed scale."""
    initial_scale_power: int = field(default=16, metadata=number(ge=0, le=63))
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = field(default=1000, metadata=number(ge=1))
    """Overflow-free steps before the dynamic scale is doubled."""
    hysteresis: int = field(default=2, metadata=number(ge=1))
    """Overflows tolerated before the dynamic scale is halved."""
    consecutive_hysteresis: bool = False
    """Refill hysteresis on every overflow-free step instead of only at a scale increase."""
    min_loss_scale: int = field(default=1, metadata=number(ge=1))
    """Lowest dynamic scale."""


@dataclass(frozen=True, kw_only=True)
class ZeroSpec:
    """DeepSpeed ZeRO partitioning; stage 0 is plain data parallelism."""

    stage: ZeroStage = 0
    """0 off, 1 optimizer states, 2 + gradients, 3 + parameters."""
    offload_optimizer: OffloadDevice = "none"
    """Keep optimizer states (and run the step) on cpu or nvme; stage 1-3."""
    offload_params: OffloadDevice = "none"
    """Keep parameters on cpu or nvme between uses; stage 3 only."""
    nvme_path: str | None = field(default=None, metadata=text(what="a path"))
    """Directory on the NVMe device; required when anything is offloaded to nvme."""
    pin_memory: bool = True
    """Page-locked host memory for offloaded tensors."""
    reduce_bucket_size: int = field(default=500_000_000, metadata=number(ge=1))
    """Elements reduced at a time."""
    allgather_bucket_size: int = field(default=500_000_000, metadata=number(ge=1))
    """Elements all-gathered at a time (stages 1-2)."""
    overlap_comm: bool | None = None
    """Overlap gradient reduction with backward; None = DeepSpeed's rule (true only at stage 3)."""
    contiguous_gradients: bool = True
    """Copy gradients into one buffer as they are produced."""
    stage3_prefetch_bucket_size: int = field(default=50_000_000, metadata=number(ge=0))
    """Stage 3: parameter elements fetched ahead of use."""
    stage3_param_persistence_threshold: int = field(default=100_000, metadata=number(ge=0))
    """Stage 3: parameters smaller than this are not partitioned."""
    stage3_max_live_parameters: int = field(default=1_000_000_000, metadata=number(ge=0))
    """Stage 3: parameter elements resident per rank before release."""
    stage3_max_reuse_distance: int = field(default=1_000_000_000, metadata=number(ge=0))
    """Stage 3: do not release a parameter reused within this many elements."""
    stage3_gather_16bit_weights_on_model_save: bool = False
    """Stage 3: gather the full 16-bit weights when saving a model."""


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """Pipeline parallelism (DeepSpeed's pipeline engine); stages divide the world size."""

    stages: int = field(default=1, metadata=number(ge=1))
    """Pipeline stages; data-parallel ranks = world size / stages."""
    partition: str = field(default="parameters", metadata=partition_method())
    """How layers are split: parameters, uniform, or type:REGEX (DeepSpeed partition_method)."""
    activation_checkpoint_interval: int = field(default=0, metadata=number(ge=0))
    """Checkpoint activations every N layers; 0 = no activation checkpointing."""


@dataclass(frozen=True, kw_only=True)
class HorovodSpec:
    """Horovod's controller, tensor fusion and reduction settings."""

    controller: HorovodController = "gloo"
    """Who coordinates the ranks: gloo or mpi."""
    fusion_threshold_mb: int = field(default=64, metadata=number(ge=0))
    """Tensor fusion buffer size in MiB (HOROVOD_FUSION_THRESHOLD is in bytes)."""
    cycle_time_ms: float = field(default=1.0, metadata=number(ge=0))
    """Milliseconds between fusion cycles."""
    cache_capacity: int = field(default=1024, metadata=number(ge=0))
    """Response cache entries; 0 disables the cache."""
    hierarchical_allreduce: bool = False
    """Reduce within each host first, then across hosts."""
    hierarchical_allgather: bool = False
    """Gather within each host first, then across hosts."""
    compression: HorovodCompression = "none"
    """Compress gradients on the wire: none or fp16 (changes the math slightly)."""
    op: HorovodOp = "average"
    """Gradient reduction: average (what every other engine does), sum or adasum."""
    timeline: str | None = field(default=None, metadata=text(what="a file name"))
    """Write a Horovod timeline to this file."""
    autotune: bool = False
    """Let Horovod tune fusion and cycle time while training (non-deterministic speed)."""


@dataclass(frozen=True, kw_only=True)
class TfSpec:
    """tf.distribute settings: MultiWorkerMirroredStrategy, or MirroredStrategy in one process."""

    communication: TfCommunication = "ring"
    """Collective implementation: ring (gRPC, works on CPU), nccl (GPUs) or auto."""
    port: int = field(default=12345, metadata=number(ge=1, le=65535))
    """Port of the first worker on each host; the next workers there use port + 1, + 2, ..."""
    local_devices: int = field(default=1, metadata=number(ge=1, le=64))
    """Replicas in one process: MirroredStrategy over this many logical CPU devices, used when
    the job has one process. Data-parallel replicas = processes * local_devices."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """How the ranks are started: launcher, process count and where they run."""

    launcher: Launcher | None = None
    """horovodrun, mpirun, deepspeed, torchrun, srun or local; None = the backend's usual one."""
    np: int | None = field(default=None, metadata=number(ge=1, le=MAX_RANKS))
    """Processes (the world size); None = the hosts' slots summed, or 1 without hosts."""
    hosts: tuple[str, ...] = field(default=(), metadata=metadata(check_host_list))
    """Hosts as "name:slots" (slots default 1); empty = this machine."""
    hostfile: str | None = field(default=None, metadata=text(what="a path"))
    """A hostfile ("name slots=N" or "name:N" per line) read when the spec is loaded."""
    master_addr: str | None = field(default=None, metadata=text(HOST_NAME, what=HOST_WHAT))
    """Rendezvous address; None = the first host, or 127.0.0.1 without hosts."""
    master_port: int = field(default=29500, metadata=number(ge=1, le=65535))
    """Rendezvous port (torch.distributed, DeepSpeed, torchrun)."""
    multinode_launcher: MultinodeLauncher = "pdsh"
    """How the deepspeed launcher reaches other hosts (its --launcher)."""
    python: str | None = field(default=None, metadata=text(what="a command"))
    """Interpreter for .py scripts; None = the one running the toolkit."""
    threads_per_rank: int = field(default=1, metadata=number(ge=1))
    """OMP_NUM_THREADS for each rank (and Slurm cpus-per-task)."""
    env: dict[str, str] = field(default_factory=dict, metadata=metadata(check_env))
    """Extra environment variables for every rank."""
    image: str = field(default="toolkit:latest", metadata=text(r"\S+", what="an image name"))
    """Container image for cluster manifests (MPIJob)."""
    job_name: str = field(default="toolkit-train", metadata=text(DNS_LABEL, what=DNS_WHAT))
    """Job name for Slurm and Kubernetes (a DNS-1123 label)."""
    partition: str | None = field(
        default=None, metadata=text(r"[A-Za-z0-9_.-]+", what="a Slurm partition name")
    )
    """Slurm partition; None = the cluster's default."""
    time_limit: str = field(default="01:00:00", metadata=text(SLURM_TIME, what=SLURM_TIME_WHAT))
    """Slurm time limit ([days-]hours:minutes:seconds)."""


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """Where and how often checkpoints are written."""

    dir: str = field(default="checkpoints", metadata=text(what="a path"))
    """Directory for checkpoints."""
    every_steps: int = field(default=0, metadata=number(ge=0))
    """Save every N optimizer steps; 0 = only at the end."""
    keep: int = field(default=3, metadata=number(ge=0, hint="0 keeps all"))
    """Newest checkpoints kept; 0 = keep all."""


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """One training job for any engine. Constructing it validates it (raises SpecError)."""

    backend: Backend = "ddp"
    """Engine: ddp, horovod, deepspeed or tf."""
    framework: Framework | None = None
    """torch or tensorflow; None = implied by backend (tf: tensorflow, others: torch)."""
    seed: int = field(default=42, metadata=number(ge=0, lt=2**32))
    """Seed for parameters, data order and dropout on every rank."""
    batch: BatchSpec = field(default_factory=BatchSpec)
    """Global, micro and accumulation batch sizes (any two given)."""
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    """Optimizer and its constants."""
    lr_scaling: LrScaling = "none"
    """none, or linear: lr * data-parallel ranks (Horovod's rule), applied in every engine."""
    clip_grad_norm: float = field(default=0.0, metadata=number(ge=0, hint="0 turns clipping off"))
    """Clip the global gradient norm to this value; 0 = off."""
    precision: Precision = "fp32"
    """fp32, fp16 (with loss_scaling) or bf16."""
    loss_scaling: LossScalingSpec = field(default_factory=LossScalingSpec)
    """fp16 loss-scaling settings."""
    zero: ZeroSpec = field(default_factory=ZeroSpec)
    """DeepSpeed ZeRO settings."""
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)
    """Pipeline parallelism settings."""
    horovod: HorovodSpec = field(default_factory=HorovodSpec)
    """Horovod settings."""
    tf: TfSpec = field(default_factory=TfSpec)
    """tf.distribute settings."""
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    """Launcher, processes and hosts."""
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    """Checkpointing."""
    log_every_steps: int = field(default=100, metadata=number(ge=1))
    """Progress lines every N steps (DeepSpeed's steps_per_print)."""

    def __post_init__(self) -> None:
        from toolkit.spec.validate import raise_if_invalid

        raise_if_invalid(self)

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: str | None = None) -> TrainSpec:
        """Build from parsed YAML/JSON; unknown keys and wrong types are SpecErrors too.

        `base_dir` anchors a relative `launch.hostfile` (default: the working directory).
        """
        from toolkit.spec.parse import spec_from_dict

        return spec_from_dict(data, base_dir=base_dir)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data with file keys (`batch.global`); from_dict(to_dict()) == self."""
        from toolkit.spec.parse import spec_to_dict

        return spec_to_dict(self)

    @property
    def framework_name(self) -> Framework:
        """The framework, resolved from the backend when not given."""
        return self.framework or engine(self.backend).framework

    @property
    def launcher(self) -> Launcher:
        """The launcher, resolved from the backend when not given."""
        return self.launch.launcher or engine(self.backend).implied_launcher

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Parsed hosts; empty means this machine."""
        return tuple(parse_host(text) for text in self.launch.hosts)

    @property
    def world_size(self) -> int:
        """Processes in the job: launch.np, else the hosts' slots, else 1."""
        if self.launch.np is not None:
            return self.launch.np
        return sum(host.slots for host in self.hosts) or 1

    @property
    def master_addr(self) -> str:
        """Rendezvous address: launch.master_addr, else the first host, else 127.0.0.1."""
        if self.launch.master_addr:
            return self.launch.master_addr
        return self.hosts[0].name if self.hosts else "127.0.0.1"

    def replicas_per_process(self, world_size: int | None = None) -> int:
        """Data-parallel replicas inside one process: tf.local_devices for a one-process
        tf job (MirroredStrategy), else 1."""
        world = self.world_size if world_size is None else world_size
        return self.tf.local_devices if self.backend == "tf" and world == 1 else 1

    def batch_for(self, world_size: int | None = None) -> ResolvedBatch:
        """The batch triple for `world_size` processes (default: this spec's); SpecError if
        impossible. MirroredStrategy's replicas in one process count as data-parallel ranks."""
        from toolkit.spec.batch import resolve_batch

        world = self.world_size if world_size is None else world_size
        replicas = world * self.replicas_per_process(world)
        return resolve_batch(self.batch, replicas, self.pipeline.stages)

    def effective_lr(self, world_size: int | None = None) -> float:
        """The learning rate every engine must use, after `lr_scaling`."""
        if self.lr_scaling == "linear":
            return self.optimizer.lr * self.batch_for(world_size).dp
        return self.optimizer.lr
