"""Rules across sections of a TrainSpec, and the facts they resolve (launcher, hosts, world).

Each rule is a pure function of the sections it reads, returning issues with their full paths.
`TrainSpec` runs each one from a validator of the last section it reads, and only when every
section it reads was valid, so one mistake never shows up as a cascade of made-up ones.
Which engine supports what, and which launcher starts what, is asked of `toolkit.engines`.

Checks that need the number of ranks (pipeline stages divide it, the batch triple, port
ranges) run here only when the spec fixes that number (launch.np or hosts); otherwise the
launcher decides it at run time and `TrainSpec.batch_for` checks it then, with the same words.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from toolkit import engines
from toolkit.spec import parameter_servers
from toolkit.spec.batch import batch_issues
from toolkit.spec.deepspeed_section import DeepSpeedSpec
from toolkit.spec.errors import SpecIssue
from toolkit.spec.hosts import Host, parse_host
from toolkit.spec.sections import (
    ActivationCheckpointingSpec,
    BatchSpec,
    CheckpointSpec,
    DdpSpec,
    FsdpSpec,
    HorovodSpec,
    LaunchSpec,
    OptimizerSpec,
    ParallelSpec,
    PipelineSpec,
    TfSpec,
    ZeroSpec,
)

MAX_PORT = 65535
MAX_LOCAL_RANKS = 256
"""Most ranks the local launcher starts on one machine."""


def _issue(path: str, value: object, allowed: str, hint: str) -> SpecIssue:
    return SpecIssue(path=path, value=value, allowed=allowed, hint=hint)


def known_framework(backend: str, framework: str | None) -> str | None:
    """`framework` when the backend runs it, else None (the backend's own)."""
    return framework if framework in engines.frameworks_of(backend) else None


def engine_of(backend: str, framework: str | None) -> engines.Engine:
    return engines.engine(backend, known_framework(backend, framework))


def launcher_of(backend: str, framework: str | None, launch: LaunchSpec) -> engines.Launcher:
    """The launcher written, else the engine's usual one."""
    return launch.launcher or engine_of(backend, framework).implied_launcher


def hosts_of(launch: LaunchSpec) -> tuple[Host, ...]:
    """The parsed hosts."""
    return _parsed_hosts(launch.hosts)[1]


def fixed_world_size(launch: LaunchSpec) -> int | None:
    """Processes the spec itself fixes: launch.np, else the hosts' slots, else one host's
    launch.gpus_per_host (one rank per GPU); None = the launcher's."""
    if launch.np is not None:
        return launch.np
    return _parsed_hosts(launch.hosts)[2] or launch.gpus_per_host


_PARSED: dict[int, tuple[tuple[str, ...], tuple[Host, ...], int]] = {}
_PARSED_KEPT = 32


def _parsed_hosts(entries: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[Host, ...], int]:
    """(entries, hosts, slots summed), parsed once per host list.

    Renderers ask for the hosts and the world size once per rank, so a parse per call is
    quadratic in a long list; a cache keyed by the tuple's value would hash the whole tuple
    on every call (tuples do not keep their hash). The key is the tuple's identity instead,
    checked (`is`) against the tuple kept in the entry, so a reused id cannot hit.
    """
    hit = _PARSED.get(id(entries))
    if hit is not None and hit[0] is entries:
        return hit
    hosts = tuple(parse_host(text) for text in entries)
    hit = (entries, hosts, sum(host.slots for host in hosts))
    if len(_PARSED) >= _PARSED_KEPT:
        _PARSED.pop(next(iter(_PARSED)), None)
    _PARSED[id(entries)] = hit
    return hit


def replicas_per_process(backend: str, framework: str | None, tf: TfSpec, world: int) -> int:
    """Data-parallel replicas inside one process: several only for a one-process job of an
    engine that can hold several (MirroredStrategy over tf.local_devices)."""
    return tf.local_devices if engine_of(backend, framework).local_devices and world == 1 else 1


def framework_issues(framework: str | None, backend: str) -> Iterator[SpecIssue]:
    allowed = engines.frameworks_of(backend)
    if framework is not None and framework not in allowed:
        yield _issue(
            "framework",
            framework,
            f"backend {backend} runs {' or '.join(allowed)}",
            "remove framework to use the backend's own",
        )


def zero_issues(zero: ZeroSpec, backend: str) -> Iterator[SpecIssue]:
    if zero.stage and not engines.engine(backend).zero:
        with_zero = ", ".join(engines.backends_with("zero"))
        yield _issue(
            "zero.stage",
            zero.stage,
            f"ZeRO needs backend {with_zero} (backend is {backend})",
            f"set backend: {with_zero}, or zero.stage: 0",
        )


def grad_norm_obstacle(
    zero: ZeroSpec, clip_grad_norm: float, precision: str, grad_accum_dtype: str | None
) -> str | None:
    """Why DeepSpeed 0.19.8 must compute the global gradient norm for this job (it refuses
    `compute_grad_norm: false` then), or None where it may skip it."""
    if zero.stage not in (1, 2):
        return f"only ZeRO stages 1 and 2 can skip it (zero.stage is {zero.stage})"
    if clip_grad_norm > 0:
        return f"clipping needs it (clip_grad_norm is {clip_grad_norm:g})"
    if zero.offload_optimizer != "none":
        return f"optimizer offload needs it (zero.offload_optimizer is {zero.offload_optimizer})"
    if zero.stage == 1 and precision == "bf16" and grad_accum_dtype == "fp32":
        return "DeepSpeed's bf16 ZeRO-1 optimizer with fp32 gradient accumulation needs it"
    return None


def grad_norm_issues(
    zero: ZeroSpec, clip_grad_norm: float, precision: str, grad_accum_dtype: str | None
) -> Iterator[SpecIssue]:
    """`zero.compute_grad_norm: false` where DeepSpeed needs the norm."""
    if zero.compute_grad_norm is not False:
        return
    obstacle = grad_norm_obstacle(zero, clip_grad_norm, precision, grad_accum_dtype)
    if obstacle:
        yield _issue(
            "zero.compute_grad_norm",
            False,
            f"false only where DeepSpeed can skip the norm: {obstacle}",
            "remove zero.compute_grad_norm (null picks false wherever it can)",
        )


def offload_issues(zero: ZeroSpec, optimizer: OptimizerSpec) -> Iterator[SpecIssue]:
    if zero.offload_optimizer != "none" and optimizer.name == "sgd":
        yield _issue(
            "zero.offload_optimizer",
            zero.offload_optimizer,
            "offloaded optimizer steps run DeepSpeedCPUAdam: optimizer.name must be adam or adamw",
            "use adam/adamw, or offload_optimizer: none",
        )


def launch_issues(launch: LaunchSpec, backend: str, framework: str | None) -> Iterator[SpecIssue]:
    launcher = launcher_of(backend, framework, launch)
    refusal = engines.launcher_refusal(backend, known_framework(backend, framework), launcher)
    if refusal is not None:
        yield _issue(
            "launch.launcher",
            launcher,
            refusal,
            "remove launch.launcher to use the backend's usual one",
        )
    hosts = hosts_of(launch)
    yield from _slot_issues(launch, launcher, hosts)
    world = fixed_world_size(launch)
    if launcher == engines.SELF_LAUNCHER and world is not None and world > MAX_LOCAL_RANKS:
        yield _issue(
            "launch.np",
            world,
            f"the local launcher starts at most {MAX_LOCAL_RANKS} ranks on this machine",
            "use srun or mpirun for bigger jobs",
        )


def restart_issues(launch: LaunchSpec, checkpoint: CheckpointSpec) -> Iterator[SpecIssue]:
    """A restarted job continues from its checkpoints: without them it would train from step
    0 again, and its restarts would hide that."""
    if not launch.max_restarts:
        return
    if checkpoint.dir is None:
        yield _issue(
            "launch.max_restarts",
            launch.max_restarts,
            "0 without checkpoint.dir (a restart resumes from its checkpoints)",
            "set checkpoint.dir and checkpoint.every_steps, e.g. checkpoint: {dir: ckpt, "
            "every_steps: 100}",
        )
    elif checkpoint.resume == "never":
        yield _issue(
            "launch.max_restarts",
            launch.max_restarts,
            "0 with checkpoint.resume: never (a restart resumes from its checkpoints)",
            "set checkpoint.resume: auto, or launch.max_restarts: 0",
        )


def elastic_issues(launch: LaunchSpec, batch: BatchSpec) -> Iterator[SpecIssue]:
    """launch.min_np acts when a restart finds hosts gone (toolkit.launch.elastic): it needs
    restarts, hosts to lose, and a global batch that the smaller world keeps."""
    min_np = launch.min_np
    if min_np is None:
        return
    allowed_world = fixed_world_size(launch)
    if not launch.max_restarts:
        yield _issue(
            "launch.min_np",
            min_np,
            "null while launch.max_restarts is 0 (the job shrinks when it restarts)",
            "set launch.max_restarts, e.g. 2, or launch.min_np: null",
        )
    if len(launch.hosts) < 2:
        yield _issue(
            "launch.min_np",
            min_np,
            "null without two or more launch.hosts (it continues on the hosts that answer)",
            "list the job's hosts in launch.hosts, or set launch.min_np: null",
        )
    elif allowed_world is not None and min_np > allowed_world:
        yield _issue(
            "launch.min_np",
            min_np,
            f"at most the job's world size ({allowed_world})",
            f"set launch.min_np between 1 and {allowed_world}",
        )
    if batch.global_ is None:
        yield _issue(
            "launch.min_np",
            min_np,
            "null without batch.global (a smaller world keeps the global batch)",
            "set batch.global and batch.micro: accumulation then follows the world size",
        )
    elif batch.micro is not None and batch.accumulation is not None:
        yield _issue(
            "launch.min_np",
            min_np,
            "null when batch gives global, micro and accumulation (accumulation must follow "
            "the world size)",
            "give batch.global and batch.micro only",
        )


def port_issues(
    launch: LaunchSpec, backend: str, framework: str | None, sections: Mapping[str, Any]
) -> Iterator[SpecIssue]:
    """Port ranges (first port + one per rank of the job) of the engine's rank ports, read
    from the valid `sections` (section name -> section); checked when the spec fixes the ranks."""
    world = fixed_world_size(launch)
    if world is None:
        return
    for field in engine_of(backend, framework).rank_ports:
        section, _, key = field.partition(".")
        if section not in sections:
            continue
        first = getattr(sections[section], key)
        if first + world - 1 > MAX_PORT:
            yield _issue(
                field,
                first,
                f"{world} ranks need ports {first} to {first + world - 1}",
                f"use a port at most {MAX_PORT - world + 1}",
            )


def gpu_issues(launch: LaunchSpec, device: str) -> Iterator[SpecIssue]:
    """launch.gpus_per_host only under device cuda, and never fewer GPUs than a host's ranks:
    each rank binds a GPU of its own (toolkit.device)."""
    gpus = launch.gpus_per_host
    if gpus is None:
        return
    if device != "cuda":
        yield _issue(
            "launch.gpus_per_host",
            gpus,
            f"counts the GPUs of a CUDA job; device is {device}",
            "set device: cuda, or remove launch.gpus_per_host",
        )
        return
    hosts = hosts_of(launch)
    crowded = [host for host in hosts if host.slots > gpus]
    if crowded:
        yield _issue(
            "launch.gpus_per_host",
            gpus,
            f"at least the ranks of every host: {crowded[0].name} runs {crowded[0].slots}",
            f"give each host at most {gpus} slots, or raise launch.gpus_per_host",
        )
    elif not hosts and launch.np is not None and launch.np > gpus:
        yield _issue(
            "launch.np",
            launch.np,
            f"at most launch.gpus_per_host ({gpus}) on one host: one rank per GPU",
            "lower launch.np, or list several hosts in launch.hosts",
        )


def stages_issues(parallel: ParallelSpec, pipeline: PipelineSpec) -> Iterator[SpecIssue]:
    """`pipeline.stages` (the earlier spelling of parallel.pipeline) beside a different
    parallel.pipeline."""
    stages = pipeline.stages
    written = "pipeline" in parallel.model_fields_set
    if stages is not None and written and stages != parallel.pipeline:
        yield _issue(
            "pipeline.stages",
            stages,
            f"must equal parallel.pipeline ({parallel.pipeline}), the layout's stages",
            "remove pipeline.stages: parallel.pipeline is where the stages live",
        )


def with_pipeline_stages(parallel: ParallelSpec, pipeline: PipelineSpec) -> ParallelSpec:
    """`parallel` with `pipeline.stages` taken in when the spec wrote only that spelling."""
    if pipeline.stages is None or "pipeline" in parallel.model_fields_set:
        return parallel
    return parallel.model_copy(update={"pipeline": pipeline.stages})


def layout_issues(parallel: ParallelSpec, backend: str, zero: ZeroSpec) -> Iterator[SpecIssue]:
    """Each degree above 1 needs an engine that runs it, and the pairs no engine here runs
    together are refused (the degrees against the world size are `world_issues`)."""
    entry = engine_of(backend, None)
    degrees = (
        ("parallel.pipeline", parallel.pipeline, "pipeline", "pipeline parallelism"),
        ("parallel.tensor", parallel.tensor, "tensor_parallel", "tensor parallelism"),
        ("parallel.replicate", parallel.replicate, "hybrid_shards", "hybrid sharding"),
    )
    for path, degree, feature, strategy in degrees:
        if degree > 1 and not getattr(entry, feature):
            able = ", ".join(engines.backends_with(feature))
            yield _issue(
                path,
                degree,
                f"1 with backend {backend}: {strategy} runs with backend {able}",
                f"set backend: {able}, or {path}: 1",
            )
            return
    if parallel.pipeline > 1 and zero.stage > engines.PIPELINE_MAX_ZERO_STAGE:
        top = engines.PIPELINE_MAX_ZERO_STAGE
        yield _issue(
            "zero.stage",
            zero.stage,
            f"the pipeline engine runs ZeRO stages 0 to {top} only",
            f"set zero.stage: {top}, or parallel.pipeline: 1",
        )
    apart = (
        ("tensor", "pipeline", "no engine here runs both"),
        ("replicate", "tensor", "HSDP beside tensor parallelism is not run here"),
    )
    for refused, beside, why in apart:
        if getattr(parallel, refused) > 1 and getattr(parallel, beside) > 1:
            yield _issue(
                f"parallel.{refused}",
                getattr(parallel, refused),
                f"1 with parallel.{beside} > 1: {why}",
                f"set parallel.{refused}: 1 or parallel.{beside}: 1",
            )


def precision_issues(precision: str, backend: str, framework: str | None) -> Iterator[SpecIssue]:
    """The precisions an engine trains in (the engine table's)."""
    entry = engine_of(backend, framework)
    if precision not in entry.precisions:
        runs = [e.name for e in engines.ENGINES if precision in e.precisions]
        yield _issue(
            "precision",
            precision,
            f"{' or '.join(entry.precisions)} with {entry.name}",
            f"use one of those, or an engine that trains in {precision} ({', '.join(runs)})",
        )


def communication_dtype_issues(deepspeed: DeepSpeedSpec, compression: str) -> Iterator[SpecIssue]:
    """DeepSpeed compresses to fp16 by reducing in fp16 (`communication_data_type`): a
    different dtype written beside `compression: fp16` contradicts it."""
    written = deepspeed.communication_data_type
    if compression == "fp16" and written not in (None, "fp16"):
        yield _issue(
            "deepspeed.communication_data_type",
            written,
            "fp16 or unset with compression fp16: DeepSpeed compresses by reducing in fp16",
            "remove deepspeed.communication_data_type, or compression",
        )


def local_sgd_issues(
    ddp: DdpSpec, backend: str, compression: str, precision: str
) -> Iterator[SpecIssue]:
    """Local SGD is DDP's (its post-local-SGD hook and averager), one communication hook per
    model, and ranks that must call the averager at the same steps."""
    if not ddp.sync.local:
        return
    value = ddp.sync.every_steps
    if not engine_of(backend, None).local_sgd:
        runs = dict.fromkeys(e.backend for e in engines.ENGINES if e.local_sgd)
        yield _issue(
            "ddp.sync.every_steps",
            value,
            f"1 with backend {backend}: local SGD is DDP's post-local SGD",
            f"set backend: {' or '.join(runs)}, or remove ddp.sync",
        )
    if compression != "none":
        yield _issue(
            "ddp.sync.every_steps",
            value,
            f"1 with compression {compression}: DDP runs one communication hook, and local "
            "SGD's replaces the compression's",
            "remove compression, or ddp.sync",
        )
    if precision == "fp16":
        yield _issue(
            "ddp.sync.every_steps",
            value,
            "1 with precision fp16: each rank would skip its own overflowed steps, and the "
            "ranks' parameter averages would no longer meet",
            "use precision: bf16 or fp32 with local SGD",
        )


LOCAL_SGD_STATE = (
    "local SGD's ranks keep their own optimizer state between averages, and a checkpoint "
    "keeps one replica's"
)


def local_sgd_checkpoint_issues(ddp: DdpSpec, checkpoint: CheckpointSpec) -> Iterator[SpecIssue]:
    """No checkpoints under local SGD: restoring one replica's state on every rank would not
    continue the run."""
    if ddp.sync.local and checkpoint.dir is not None:
        yield _issue(
            "checkpoint.dir",
            checkpoint.dir,
            f"unset with ddp.sync.every_steps {ddp.sync.every_steps}: {LOCAL_SGD_STATE}",
            "remove checkpoint.dir, or ddp.sync",
        )


def fsdp_issues(fsdp: FsdpSpec, backend: str, device: str) -> Iterator[SpecIssue]:
    """FSDP offloads only from a GPU."""
    entry = engine_of(backend, None)
    if entry.hybrid_shards and fsdp.offload == "cpu" and device == "cpu":
        yield _issue(
            "fsdp.offload",
            fsdp.offload,
            "none with device cpu: FSDP2 offloads from a GPU to the host",
            "set fsdp.offload: none, or device: cuda",
        )


ONEBIT_ALLOWED = (
    "none, fp16, bf16 or powersgd: the DeepSpeed the toolkit runs (0.19) has no 1-bit Adam "
    "(DeepSpeed PR 8490 removed it with 1-bit LAMB and 0/1 Adam), and earlier releases ran "
    "its compressed all-reduce on GPUs only (NCCL or MPI with CUDA), never on the CPU"
)
"""Why `compression: onebit_adam` is refused on every device."""


def compression_issues(
    compression: str, backend: str, framework: str | None, horovod: HorovodSpec, device: str
) -> Iterator[SpecIssue]:
    """Compression only as an engine runs it; Horovod's own field is its earlier spelling."""
    entry = engine_of(backend, framework)
    if compression == "onebit_adam":
        hint = "use compression: fp16 (DeepSpeed's communication_data_type) or powersgd (DDP)"
        yield _issue("compression", compression, ONEBIT_ALLOWED, hint)
        return
    if compression == "bf16" and device == "cpu":
        yield _issue(
            "compression",
            compression,
            "fp16 or powersgd on CPU: DDP's bf16 hook needs CUDA 11+ with NCCL 2.10+",
            "set compression: fp16, or device: cuda",
        )
    if compression not in entry.compressions:
        runs = [e.backend for e in engines.ENGINES if compression in e.compressions]
        yield _issue(
            "compression",
            compression,
            f"{', '.join(entry.compressions)} with backend {backend}",
            f"set backend: {' or '.join(dict.fromkeys(runs))}, or remove compression",
        )
    if horovod.compression != "none" and compression not in ("none", horovod.compression):
        yield _issue(
            "horovod.compression",
            horovod.compression,
            f"the same as compression ({compression}): it is compression's earlier spelling",
            "remove horovod.compression",
        )


def recompute_issues(
    section: ActivationCheckpointingSpec,
    backend: str,
    framework: str | None,
    parallel: ParallelSpec,
) -> Iterator[SpecIssue]:
    """Recomputation runs on the torch engines, not through the pipeline engine's stages, and
    DeepSpeed's own options only on DeepSpeed."""
    entry = engine_of(backend, framework)
    if section.modules and entry.framework != "torch":
        yield _issue(
            "activation_checkpointing.modules",
            section.modules,
            f"the torch engines (backend {backend} runs {entry.framework})",
            "remove activation_checkpointing, or use a torch engine",
        )
    if section.modules and parallel.pipeline > 1:
        yield _issue(
            "activation_checkpointing.modules",
            section.modules,
            "none with pipeline stages: the pipeline engine recomputes by layer interval",
            "set pipeline.activation_checkpoint_interval instead",
        )
    for key in ("partition_activations", "cpu_checkpointing"):
        if getattr(section, key) and not entry.deepspeed_settings:
            yield _issue(
                f"activation_checkpointing.{key}",
                True,
                f"backend {', '.join(engines.backends_with('deepspeed_settings'))} only",
                f"remove activation_checkpointing.{key}, or set backend: deepspeed",
            )


def tf_device_issues(tf: TfSpec, device: str) -> Iterator[SpecIssue]:
    """NCCL collectives need GPUs: tf.communication nccl is refused for device cpu."""
    if tf.communication == "nccl" and device == "cpu":
        yield _issue(
            "tf.communication",
            tf.communication,
            "ring or auto with device cpu: NCCL runs between GPUs only",
            "use ring (or auto), or set device: cuda",
        )


def _slot_issues(
    launch: LaunchSpec, launcher: engines.Launcher, hosts: tuple[Host, ...]
) -> Iterator[SpecIssue]:
    slots = sum(host.slots for host in hosts)
    if hosts and launch.np is not None:
        if launcher in engines.NP_WITHIN_SLOTS and launch.np > slots:
            yield _issue(
                "launch.np",
                launch.np,
                f"{launcher} needs np <= the hosts' slots ({slots})",
                "add slots to launch.hosts, or lower np",
            )
        if launcher in engines.ONE_RANK_PER_SLOT and launch.np != slots:
            yield _issue(
                "launch.np",
                launch.np,
                f"{launcher} starts one rank per slot: np must equal the hosts' slots ({slots})",
                "remove launch.np to use the slots",
            )
    if launcher in engines.EQUAL_SLOTS and len({host.slots for host in hosts}) > 1:
        yield _issue(
            "launch.hosts",
            list(launch.hosts),
            f"{launcher} runs the same process count on every host: slots must be equal",
            "give every host the same slots, or use another launcher",
        )


def world_issues(
    launch: LaunchSpec,
    backend: str,
    framework: str | None,
    batch: BatchSpec,
    parallel: ParallelSpec,
    tf: TfSpec,
) -> list[SpecIssue]:
    """The batch triple and the parallel layout against the world size, when the spec fixes
    it."""
    world = fixed_world_size(launch)
    if world is None:
        return []
    replicas = parameter_servers.data_replicas(
        tf, world, replicas_per_process(backend, framework, tf, world)
    )
    return [*batch_issues(batch, replicas, parallel), *parameter_servers.world_issues(tf, world)]


def horovod_issues(
    horovod: HorovodSpec, backend: str, framework: str | None, launch: LaunchSpec
) -> Iterator[SpecIssue]:
    """A controller written that the launcher cannot run (an unset one follows the launcher),
    and Adasum on a world size that is not a power of two (Horovod's rule for it)."""
    world = fixed_world_size(launch)
    if horovod.op == "adasum" and world is not None and world & (world - 1):
        yield _issue(
            "horovod.op",
            "adasum",
            f"a power-of-two world size for adasum (launch gives {world} ranks)",
            "run 2, 4, 8, ... ranks, or set horovod.op: average",
        )
    written = horovod.controller_setting
    entry = engine_of(backend, framework)
    if not entry.controllers or written is None:
        return
    launcher = launcher_of(backend, framework, launch)
    allowed = engines.controllers_under(launcher)
    if written not in allowed:
        others = [name for name in entry.launchers if written in engines.controllers_under(name)]
        yield _issue(
            "horovod.controller",
            written,
            f"{entry.backend} under {launcher} runs the {' or '.join(allowed)} controller",
            "remove horovod.controller to follow the launcher, or set launch.launcher: "
            + " or ".join(others),
        )
