"""The one table of engines and launchers: everything else asks it, nothing else branches on names.

For each (backend, framework) pair it holds the implied launcher, the launchers `toolkit launch`
may start it with, the launch environments its ranks can run in, the class that implements it,
the probe `toolkit doctor` runs for it, its spec section, plan rule and bench native script,
and the per-rank environment it needs. Adding an engine is one backend package and one row
here (CONTRIBUTING.md); tests/test_engine_table.py fails while a row lacks any part. Spec
validation, the backend registry, doctor, the launch renderers and the parity cases all read this
module, so the answer to "can launcher L start engine E?" is the same everywhere.

Two vocabularies meet here:

- *Launchers* are what a user names in `launch.launcher` and what `toolkit launch` runs:
  horovodrun, mpirun, deepspeed, torchrun, srun and local (the toolkit's own process starter).
- *Environments* are what a rank finds when it starts (`toolkit.launch.environment` detects
  them from variables): one per launcher, except that one launcher can produce several
  (horovodrun --mpi ranks are plain Open MPI processes; the deepspeed runner's multi-node back
  ends run mpirun, hydra or srun directly), plus three that no launcher of ours produces:
  `tf_config` (a TF_CONFIG written by hand or by a cluster operator), `torch_env` (RANK and
  WORLD_SIZE exported by hand) and `single` (no launcher: one process).

This module imports nothing from the toolkit or any engine: targets are "module:attribute"
strings, resolved by whoever needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Backend = Literal["ddp", "fsdp", "horovod", "deepspeed", "tf"]
Framework = Literal["torch", "tensorflow"]
Launcher = Literal["horovodrun", "mpirun", "deepspeed", "torchrun", "srun", "local"]
Environment = Literal[
    "horovodrun", "openmpi", "mpich", "deepspeed", "torchrun", "srun", "local",
    "tf_config", "torch_env", "single",
]  # fmt: skip

BACKENDS: tuple[Backend, ...] = get_args(Backend)
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)

MPI_ENVIRONMENTS: tuple[Environment, ...] = ("openmpi", "mpich")

SELF_LAUNCHER: Launcher = "local"
"""The toolkit's own launcher: it starts each rank itself, on this machine."""
EXTERNAL_LAUNCHERS: tuple[Launcher, ...] = tuple(
    name for name in LAUNCHERS if name != SELF_LAUNCHER
)
"""Launchers that are programs of their own, found on PATH."""

LAUNCHER_ENVIRONMENTS: dict[Launcher, tuple[Environment, ...]] = {
    "horovodrun": ("horovodrun", *MPI_ENVIRONMENTS),
    "mpirun": MPI_ENVIRONMENTS,
    "deepspeed": ("deepspeed", *MPI_ENVIRONMENTS, "srun"),
    "torchrun": ("torchrun",),
    "srun": ("srun",),
    "local": ("local",),
}
"""The environments a rank started by each launcher may detect, the launcher's own first."""

MPI_LAUNCHERS: tuple[Launcher, ...] = ("mpirun", "srun")
"""Launchers whose ranks are MPI processes to Horovod: its controller must be mpi there."""

Controller = Literal["gloo", "mpi"]
"""Who coordinates an engine's ranks, for engines that can choose (`Engine.controllers`)."""

ONE_RANK_PER_SLOT: tuple[Launcher, ...] = ("deepspeed", "torchrun", "srun", "local")
"""Launchers that start exactly one rank per host slot (np must equal the slots)."""

NP_WITHIN_SLOTS: tuple[Launcher, ...] = ("horovodrun",)
"""Launchers that start np ranks over the hosts' slots and refuse np above the slots."""

EQUAL_SLOTS: tuple[Launcher, ...] = ("torchrun",)
"""Launchers that run the same per-node process count on every host: slots must be equal."""

HOST_ORDER_LAUNCHERS: tuple[Launcher, ...] = ("horovodrun", "mpirun", "deepspeed", "local")
"""Launchers that place ranks on the hosts in the order the plan does (hosts in order, slots
filled), so the plan names each rank's host; torchrun's rendezvous and srun decide at run time."""

SSH_STARTED: tuple[Launcher, ...] = ("torchrun", "local")
"""Launchers that reach no other host themselves: `toolkit launch` starts them (torchrun once
per host) or their ranks (local) on the other hosts over ssh."""

ALLOCATION_LAUNCHERS: tuple[Launcher, ...] = ("srun", "mpirun")
"""Launchers that fill a Slurm allocation: `toolkit launch` inside salloc or an sbatch script
takes the allocation's task count when the spec fixes none."""

PIPELINE_MAX_ZERO_STAGE = 1
"""Highest ZeRO stage a pipeline-parallel engine runs (DeepSpeed's PipelineEngine: 0 or 1)."""

MPIJOB_LAUNCHERS: tuple[Launcher, ...] = ("mpirun",)
"""Launchers a Kubeflow MPIJob runs: its launcher pod runs mpirun over the worker pods."""

SLURM_SIGNALLED: tuple[Launcher, ...] = ("srun", SELF_LAUNCHER)
"""Launchers that Slurm's --signal reaches in a batch script: srun's tasks are the ranks, and
under the local launcher the task is `toolkit launch`, which passes it on. torchrun and mpirun
die of a SIGUSR1; horovodrun and the deepspeed launcher run outside a job step."""


@dataclass(frozen=True, kw_only=True)
class Engine:
    """One (backend, framework) pair and everything the toolkit needs to know to run it."""

    backend: Backend
    framework: Framework
    backend_class: str
    """"module:Class" of its `toolkit.backends.base.Backend` implementation."""
    package: str
    """The installed package the engine stands on; `toolkit doctor` reports by this name."""
    probe: str
    """Module `toolkit doctor` runs (`python -m`) to report on `package`."""
    spec_section: str
    """The TrainSpec field holding the settings only this engine reads."""
    plan_rule: str
    """"module:function" giving its rows of `toolkit plan` (toolkit.plan.table.PlanRule)."""
    bench_native: str
    """"module:attribute" of the native script `toolkit bench step` times it against
    (a toolkit.bench.cases.Native)."""
    repair: str | None = None
    """A command that repairs a broken install beyond the usual `make setup`, if any."""
    launchers: tuple[Launcher, ...]
    """Launchers that can start its ranks, the implied one (used when the spec names none)
    first. `toolkit launch` may use each of them."""
    standalone_environments: tuple[Environment, ...]
    """Environments, beyond its launchers', that its ranks can start in without a launcher."""
    job_env: str | None = None
    """"module:function" rendering, from the spec, the variables every rank of this engine
    needs under any launcher (Horovod's HOROVOD_* tuning), or None."""
    local_rank_env: str | None = None
    """"module:function" rendering, from the spec, what the toolkit's own local launcher must
    give each rank beyond its TOOLKIT_* variables (TF_CONFIG), as a list in rank order."""
    zero: bool = False
    """Runs ZeRO partitioning (spec `zero.stage` above 0)."""
    pipeline: bool = False
    """Runs pipeline parallelism (spec `parallel.pipeline` above 1)."""
    deepspeed_settings: bool = False
    """Honours the spec's `deepspeed` section (pre-division, auto_cast, accumulation and
    communication dtypes) and Adam without bias correction (`optimizer.bias_correction`)."""
    controllers: tuple[Controller, ...] = ()
    """Controllers it can coordinate its ranks with (spec `horovod.controller`); empty when it
    has no such choice. Which one a launcher implies: `controllers_under`."""
    local_devices: bool = False
    """A job of one process runs several replicas in it (MirroredStrategy over
    `tf.local_devices`), which count as data-parallel ranks."""
    parameter_server_class: str | None = None
    """"module:Class" of the backend that runs `tf.strategy: parameter_server` (TensorFlow's
    ParameterServerStrategy), or None where the engine has no parameter servers."""
    precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")
    """The spec's precisions it trains in; others are refused by `toolkit spec check`."""
    tensor_parallel: bool = False
    """Runs tensor parallelism (spec `parallel.tensor` above 1) with DTensor's
    parallelize_module over groups of consecutive ranks."""
    hybrid_shards: bool = False
    """Shards over a mesh of `parallel.replicate` x shard ranks (FSDP's HSDP), so replicate must
    divide the world size."""
    compressions: tuple[str, ...] = ("none",)
    """Gradient compression it runs on the wire (spec `compression`): DDP's communication
    hooks, Horovod's Compression.fp16; "none" only where the engine has none the toolkit
    runs."""
    local_sgd: bool = False
    """Runs local SGD (spec `ddp.sync.every_steps` above 1): DDP's post-local SGD."""
    rank_ports: tuple[str, ...] = ()
    """Spec fields ("section.key") holding the first of a range of ports, one per rank of the
    job (port, port + 1, ...): each range must end at or below 65535."""

    @property
    def name(self) -> str:
        return f"{self.backend}+{self.framework}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.backend, self.framework)

    @property
    def package_dir(self) -> str:
        """Its backend package, relative to toolkit/ ("backends/ddp")."""
        module = self.backend_class.partition(":")[0]
        return "/".join(module.split(".")[1:3])

    @property
    def implied_launcher(self) -> Launcher:
        return self.launchers[0]

    @property
    def environments(self) -> frozenset[Environment]:
        """Every environment its ranks may start in."""
        from_launchers = (
            env for launcher in self.launchers for env in LAUNCHER_ENVIRONMENTS[launcher]
        )
        return frozenset((*from_launchers, *self.standalone_environments))


_HOROVOD_ENV = "toolkit.render.horovod:environment"
# Horovod is compiled against the installed torch and TF; a stale cached wheel must go.
_HOROVOD_REBUILD = "rm -rf ~/.cache/toolkit/wheels/horovod-*"

ENGINES: tuple[Engine, ...] = (
    Engine(
        backend="ddp",
        framework="torch",
        compressions=("none", "fp16", "bf16", "powersgd"),
        local_sgd=True,
        backend_class="toolkit.backends.ddp.backend:DDPBackend",
        package="torch",
        probe="toolkit.backends.ddp.probe",
        spec_section="ddp",
        plan_rule="toolkit.plan.table:ddp_rows",
        bench_native="toolkit.bench.cases:DDP",
        launchers=("torchrun", "mpirun", "deepspeed", "srun", "local"),
        standalone_environments=("torch_env", "single"),
    ),
    # PyTorch FSDP2: fully_shard over a DeviceMesh (HSDP with parallel.replicate), torch's own
    # groups, so it starts wherever DDP does.
    Engine(
        backend="fsdp",
        framework="torch",
        backend_class="toolkit.backends.fsdp.backend:FSDPBackend",
        package="torch",
        probe="toolkit.backends.ddp.probe",  # torch's probe: one per package
        spec_section="fsdp",
        plan_rule="toolkit.plan.table:fsdp_rows",
        bench_native="toolkit.bench.cases:FSDP",
        launchers=("torchrun", "mpirun", "srun", "local"),
        standalone_environments=("torch_env", "single"),
        tensor_parallel=True,
        hybrid_shards=True,
    ),
    Engine(
        backend="deepspeed",
        framework="torch",
        compressions=("none", "fp16"),  # its communication_data_type
        backend_class="toolkit.backends.deepspeed.backend:DeepSpeedBackend",
        package="deepspeed",
        probe="toolkit.backends.deepspeed.probe",
        spec_section="deepspeed",
        plan_rule="toolkit.plan.table:deepspeed_rows",
        bench_native="toolkit.bench.cases:DEEPSPEED",
        launchers=("deepspeed", "torchrun", "mpirun", "srun", "local"),
        standalone_environments=("torch_env", "single"),
        zero=True,
        pipeline=True,
        deepspeed_settings=True,
    ),
    # Horovod's Gloo controller needs the rendezvous server horovodrun starts; under mpirun its
    # ranks are MPI processes and take the MPI controller. srun would need a PMI-enabled MPI
    # (srun --mpi=pmix) that Debian's Slurm and Open MPI do not give together, so inside a
    # Slurm allocation Horovod runs under mpirun.
    Engine(
        backend="horovod",
        framework="torch",
        compressions=("none", "fp16"),
        backend_class="toolkit.backends.horovod.torch_backend:HorovodTorchBackend",
        package="horovod",
        probe="toolkit.backends.horovod.probe",
        repair=_HOROVOD_REBUILD,
        spec_section="horovod",
        plan_rule="toolkit.plan.table:horovod_torch_rows",
        bench_native="toolkit.bench.cases:HOROVOD_TORCH",
        launchers=("horovodrun", "mpirun"),
        standalone_environments=("single",),
        job_env=_HOROVOD_ENV,
        controllers=("gloo", "mpi"),
    ),
    Engine(
        backend="horovod",
        framework="tensorflow",
        compressions=("none", "fp16"),
        backend_class="toolkit.backends.horovod.tf_backend:HorovodTFBackend",
        precisions=("fp32", "fp16"),  # Keras' mixed_bfloat16 is not parity-checked here
        package="horovod",
        probe="toolkit.backends.horovod.probe",
        repair=_HOROVOD_REBUILD,
        spec_section="horovod",
        plan_rule="toolkit.plan.table:horovod_tf_rows",
        bench_native="toolkit.bench.cases:HOROVOD_TF",
        launchers=("horovodrun", "mpirun"),
        standalone_environments=("single",),
        job_env=_HOROVOD_ENV,
        controllers=("gloo", "mpi"),
    ),
    # MultiWorkerMirroredStrategy reads TF_CONFIG: the local launcher writes one per rank, and
    # under srun or mpirun the backend builds it from the launcher's rank and host list.
    Engine(
        backend="tf",
        framework="tensorflow",
        backend_class="toolkit.backends.tf.backend:TFBackend",
        parameter_server_class="toolkit.backends.tf.parameter_server:ParameterServerBackend",
        precisions=("fp32", "fp16"),
        package="tensorflow",
        probe="toolkit.backends.tf.probe",
        spec_section="tf",
        plan_rule="toolkit.plan.table:tf_rows",
        bench_native="toolkit.bench.cases:TF_MWMS",
        launchers=("local", "mpirun", "srun"),
        standalone_environments=("tf_config", "single"),
        local_rank_env="toolkit.render.tf:local_rank_environments",
        local_devices=True,
        rank_ports=("tf.port",),
    ),
)

_BY_PAIR: dict[tuple[str, str], Engine] = {(e.backend, e.framework): e for e in ENGINES}

IMPLIED_FRAMEWORK: dict[str, Framework] = {}
"""The framework each backend runs when the spec does not name one: its first entry above."""
for _engine in ENGINES:
    IMPLIED_FRAMEWORK.setdefault(_engine.backend, _engine.framework)


class UnknownEngine(LookupError):
    """A (backend, framework) pair that is not in the table."""


def frameworks_of(backend: str) -> tuple[Framework, ...]:
    """Frameworks a backend runs, in table order."""
    return tuple(e.framework for e in ENGINES if e.backend == backend)


def engine(backend: str, framework: str | None = None) -> Engine:
    """The table entry for a pair; `framework=None` means the backend's implied one."""
    if framework is None and backend in IMPLIED_FRAMEWORK:
        framework = IMPLIED_FRAMEWORK[backend]
    found = _BY_PAIR.get((backend, framework or ""))
    if found is None:
        pairs = ", ".join(e.name for e in ENGINES)
        raise UnknownEngine(f"backend {backend!r} with framework {framework!r}; supported: {pairs}")
    return found


def _started_by(entry: Engine) -> str:
    return f"backend {entry.backend} ({entry.framework}) is started by {', '.join(entry.launchers)}"


def launcher_refusal(backend: str, framework: str | None, launcher: str) -> str | None:
    """Why `launcher` cannot start the engine, as "allowed" text; None when it can.

    The same words as `environment_refusal`, so that `toolkit spec check`, `toolkit launch`,
    `toolkit config sbatch` and `toolkit.init` refuse a pair alike.
    """
    entry = engine(backend, framework)
    return None if launcher in entry.launchers else _started_by(entry)


def environment_refusal(backend: str, framework: str | None, environment: str) -> str | None:
    """Why a rank that detected `environment` cannot run the engine; None when it can."""
    entry = engine(backend, framework)
    return None if environment in entry.environments else _started_by(entry)


def controllers_under(launcher: str) -> tuple[Controller, ...]:
    """Controllers an engine with a choice can use under `launcher`, its default first: under
    an MPI launcher the ranks are MPI processes (mpi only); horovodrun runs either, and given
    neither --gloo nor --mpi it runs MPI when Horovod was built with it, which only the machine
    can tell (toolkit.launch.machine_settings): gloo, the choice without MPI, stands first."""
    return ("mpi",) if launcher in MPI_LAUNCHERS else ("gloo", "mpi")


def backends_with(feature: str) -> tuple[Backend, ...]:
    """Backends with a boolean `Engine` feature ("zero", "pipeline", ...), in table order."""
    return tuple(dict.fromkeys(e.backend for e in ENGINES if getattr(e, feature)))


def launchers_producing(environment: str) -> tuple[Launcher, ...]:
    """Launchers whose ranks may detect `environment`."""
    return tuple(name for name, envs in LAUNCHER_ENVIRONMENTS.items() if environment in envs)
