"""Which launcher started this process, and what it says about the process's place in the job.

Each launcher announces rank, world size and so on in its own environment variables. A
`Detector` knows one launcher's variables; `DETECTORS` lists them in the order they are tried,
and the first that recognises the environment describes the process as a `LaunchEnvironment`.
Naming the launcher (`detect_environment(env, argv, launcher="torchrun")`) skips the guessing,
and then missing variables are an error instead of a silent single-process run.

The order encodes one rule: the launcher that started this process directly wins over any outer
launcher whose variables it inherited. Launchers copy their whole environment into the ranks,
so `srun torchrun ...` gives each torchrun worker the SLURM_PROCID of its node's torchrun agent,
and an `mpirun` inside an sbatch allocation gives every rank the batch step's SLURM_*. Variables
that only an inner launcher sets therefore come before the ones an outer launcher leaves behind.

What the real launchers set, as seen on Debian 12 with Open MPI 4.1.4, torch 2.13, DeepSpeed
0.19.8 and Horovod 0.28.1 (2 processes on one machine; tests/test_launch_environment_real.py):

- Open MPI gives no node index. OMPI_COMM_WORLD_NODE_RANK, despite its name, is the rank among
  the processes on this node (it equals the local rank), so node_rank is derived as
  rank // local size, which holds for mpirun's default by-slot mapping.
- horovodrun --gloo sets HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK,
  _CROSS_SIZE, _HOSTNAME, _CONTROLLER=gloo and HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT (its own
  rendezvous server, 127.0.0.1 on one machine). horovodrun --mpi sets no HOROVOD_* variable at
  all: its ranks are plain Open MPI processes.
- The deepspeed launcher sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK (node
  index), CROSS_SIZE, MASTER_ADDR (127.0.0.1 on one machine) and MASTER_PORT (29500 unless
  --master_port is given, so two jobs on one machine collide), appends --local_rank=N right
  after the program (so `--no_python python -m mod` breaks: use `--module mod`), and on a
  machine without a GPU also sets CUDA_VISIBLE_DEVICES=0,1,... It counts one CPU "device" per
  NUMA node (or LOCAL_SIZE), so a 2-process CPU run needs --num_gpus 2. It sets
  OMP_NUM_THREADS only with --bind_cores_to_rank. Its multi-node MPI and Slurm back ends
  (--launcher openmpi|mpich|impi|slurm) run the script directly under mpirun or srun and set
  none of these: such processes are detected as "openmpi", "mpich" or "srun".
- torchrun sets TORCHELASTIC_RUN_ID, GROUP_RANK (node index), LOCAL_WORLD_SIZE,
  MASTER_ADDR=localhost, and OMP_NUM_THREADS=1 when it starts more than one process per node.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from toolkit.engines import LAUNCHER_ENVIRONMENTS
from toolkit.errors import ToolkitError
from toolkit.launch.slurm import expand_hostlist, expand_tasks_per_node

# The toolkit's own local launcher (toolkit.launch.supervisor.run_local) sets these in each rank.
TOOLKIT_RANK = "TOOLKIT_RANK"
TOOLKIT_WORLD_SIZE = "TOOLKIT_WORLD_SIZE"
TOOLKIT_LOCAL_RANK = "TOOLKIT_LOCAL_RANK"
TOOLKIT_MASTER_ADDR = "TOOLKIT_MASTER_ADDR"
TOOLKIT_MASTER_PORT = "TOOLKIT_MASTER_PORT"

_STALE_HINT = (
    "the launcher sets this for each process; a value exported by hand or left over from an "
    "outer job gives this result: unset it, or name the launcher explicitly"
)


@dataclass(frozen=True)
class LaunchEnvironment:
    """This process's place in the job, as its launcher described it."""

    launcher: str
    """The detector that recognised the environment, e.g. "torchrun", "openmpi", "single"."""
    rank: int
    local_rank: int
    """Rank among the processes on this machine."""
    world_size: int
    local_world_size: int
    """Number of processes on this machine."""
    node_rank: int
    """Index of this machine in the job."""
    master_addr: str | None = None
    """Rendezvous host the launcher named, if any."""
    master_port: int | None = None
    """Rendezvous port the launcher named, if any. It is already spoken for: rank 0's store for
    torch-style launchers, horovodrun's own Gloo rendezvous server, the first TF_CONFIG task's
    server. Connect to it; an engine that needs a listening port of its own must pick another."""
    hosts: tuple[str, ...] = ()
    """Every host of the job in order, where the launcher lists them (TF_CONFIG: "host:port"
    per task; Slurm: the step's node names); empty otherwise."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        value = int(raw.strip())
    except ValueError:
        raise ToolkitError(f"{name}={raw!r} is not an integer.", _STALE_HINT) from None
    if value < 0:
        raise ToolkitError(f"{name}={raw!r} is negative.", _STALE_HINT)
    return value


def _port(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name):
        return None
    port = _int(env, name)
    if not 0 < port < 65536:
        raise ToolkitError(f"{name}={env[name]!r} is not a TCP port (1-65535).", _STALE_HINT)
    return port


def _checked(environment: LaunchEnvironment, sources: Mapping[str, str]) -> LaunchEnvironment:
    """Reject a self-contradicting description; `sources` names where each field came from."""
    e = environment
    pairs = (
        ("rank", e.rank, "world_size", e.world_size),
        ("local_rank", e.local_rank, "local_world_size", e.local_world_size),
        ("node_rank", e.node_rank, "world_size", e.world_size),
    )
    if e.world_size < 1:
        raise ToolkitError(
            f"{sources['world_size']}={e.world_size}: must be at least 1.", _STALE_HINT
        )
    if e.local_world_size < 1 or e.local_world_size > e.world_size:
        raise ToolkitError(
            f"{sources['local_world_size']}={e.local_world_size} is outside 1.."
            f"{sources['world_size']}={e.world_size}.",
            _STALE_HINT,
        )
    for field, value, limit_field, limit in pairs:
        if value >= limit:
            raise ToolkitError(
                f"{sources[field]}={value} is not below {sources[limit_field]}={limit} "
                f"(launcher {e.launcher}).",
                _STALE_HINT,
            )
    return e


class Detector(ABC):
    """One launcher's variables. `required` are the ones whose presence means this launcher;
    `claims` adds conditions that only automatic detection checks (naming a launcher
    explicitly skips them)."""

    name: ClassVar[str]
    required: ClassVar[tuple[str, ...]]

    @classmethod
    def missing(cls, env: Mapping[str, str]) -> list[str]:
        return [name for name in cls.required if name not in env]

    @classmethod
    def claims(cls, env: Mapping[str, str]) -> bool:
        return True

    @classmethod
    def detect(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment | None:
        if cls.missing(env) or not cls.claims(env):
            return None
        return cls.read(env, argv)

    @classmethod
    @abstractmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        """Describe the process; only called once every `required` variable is present."""


class ToolkitLocal(Detector):
    """The toolkit's own local launcher: one machine, so local and global ranks coincide."""

    name = "local"
    required = (TOOLKIT_RANK, TOOLKIT_WORLD_SIZE, TOOLKIT_LOCAL_RANK)

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        world = _int(env, TOOLKIT_WORLD_SIZE)
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=_int(env, TOOLKIT_RANK),
            local_rank=_int(env, TOOLKIT_LOCAL_RANK),
            world_size=world,
            local_world_size=world,
            node_rank=0,
            master_addr=env.get(TOOLKIT_MASTER_ADDR) or None,
            master_port=_port(env, TOOLKIT_MASTER_PORT),
        )
        sources = {
            "rank": TOOLKIT_RANK,
            "local_rank": TOOLKIT_LOCAL_RANK,
            "world_size": TOOLKIT_WORLD_SIZE,
            "local_world_size": TOOLKIT_WORLD_SIZE,
            "node_rank": "node rank",
        }
        return _checked(environment, sources)


class HorovodRun(Detector):
    """`horovodrun --gloo` (the default without MPI). The master address and port are
    horovodrun's own Gloo rendezvous server."""

    name = "horovodrun"
    required = (
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK",
    )

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=_int(env, "HOROVOD_RANK"),
            local_rank=_int(env, "HOROVOD_LOCAL_RANK"),
            world_size=_int(env, "HOROVOD_SIZE"),
            local_world_size=_int(env, "HOROVOD_LOCAL_SIZE"),
            node_rank=_int(env, "HOROVOD_CROSS_RANK"),
            master_addr=env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or None,
            master_port=_port(env, "HOROVOD_GLOO_RENDEZVOUS_PORT"),
        )
        sources = {
            "rank": "HOROVOD_RANK",
            "local_rank": "HOROVOD_LOCAL_RANK",
            "world_size": "HOROVOD_SIZE",
            "local_world_size": "HOROVOD_LOCAL_SIZE",
            "node_rank": "HOROVOD_CROSS_RANK",
        }
        return _checked(environment, sources)


class TorchRun(Detector):
    """`torchrun` (torch's elastic agent), also `python -m torch.distributed.run`."""

    name = "torchrun"
    required = (
        "TORCHELASTIC_RUN_ID",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
    )

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            node_rank=_int(env, "GROUP_RANK"),
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_port(env, "MASTER_PORT"),
        )
        sources = {name.lower(): name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        sources |= {"local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK"}
        return _checked(environment, sources)


class DeepSpeed(Detector):
    """The `deepspeed` launcher (its per-node deepspeed.launcher.launch). Told apart from
    torchrun, which also sets RANK and LOCAL_RANK, by LOCAL_SIZE and the absence of
    TORCHELASTIC_RUN_ID (`deepspeed --elastic_training` runs torch's elastic agent and is
    detected as torchrun, with the same meaning)."""

    name = "deepspeed"
    required = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE")

    @classmethod
    def claims(cls, env: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" not in env

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        local_rank = _int(env, "LOCAL_RANK")
        _, argument = split_local_rank_arg(argv)
        if argument is not None and argument != local_rank:
            raise ToolkitError(
                f"--local_rank={argument} in the script's arguments disagrees with "
                f"LOCAL_RANK={local_rank}.",
                "pass the script's own arguments after the ones the deepspeed launcher adds, "
                "and do not give --local_rank yourself",
            )
        world = _int(env, "WORLD_SIZE")
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=_int(env, "RANK"),
            local_rank=local_rank,
            world_size=world,
            local_world_size=_int(env, "LOCAL_SIZE"),
            node_rank=_int(env, "CROSS_RANK") if "CROSS_RANK" in env else 0,
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_port(env, "MASTER_PORT"),
        )
        sources = {name.lower(): name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        sources |= {"local_world_size": "LOCAL_SIZE", "node_rank": "CROSS_RANK"}
        return _checked(environment, sources)


class _MPI(Detector):
    """An MPI launcher, whose `required` are its rank, size, local rank and local size
    variables. No MPI launcher names the node, so node_rank assumes ranks fill one node before
    the next (the default mapping of mpirun and hydra). MASTER_ADDR/PORT are read when the job
    exported them (mpirun -x)."""

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        rank_name, size_name, local_rank_name, local_size_name = cls.required
        rank = _int(env, rank_name)
        local_size = _int(env, local_size_name)
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=rank,
            local_rank=_int(env, local_rank_name),
            world_size=_int(env, size_name),
            local_world_size=local_size,
            node_rank=rank // local_size if local_size else 0,
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_port(env, "MASTER_PORT"),
        )
        sources = {
            "rank": rank_name,
            "local_rank": local_rank_name,
            "world_size": size_name,
            "local_world_size": local_size_name,
            "node_rank": f"{rank_name} // {local_size_name}",
        }
        return _checked(environment, sources)


class OpenMPI(_MPI):
    """Open MPI's mpirun, which `horovodrun --mpi` and deepspeed's openmpi back end run."""

    name = "openmpi"
    required = (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    )


class MPICH(_MPI):
    """MPICH's and Intel MPI's hydra launcher (mpiexec / mpirun). Slurm's PMI2 plugin sets
    PMI_RANK too but not MPI_LOCALRANKID, so `srun --mpi=pmi2` falls through to Srun."""

    name = "mpich"
    required = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _split_host_port(address: str, source: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ToolkitError(
            f"{source} entry {address!r} is not host:port.",
            'write each TF_CONFIG cluster task as "host:port", e.g. "10.0.0.1:2222"',
        )
    return host.strip("[]"), int(port_text)


class TFConfig(Detector):
    """TF_CONFIG, which tf.distribute reads itself: there is no launcher, the user or an
    operator (Kubeflow's TFJob) writes it per worker. The chief, if any, is rank 0 and the
    workers follow; processes sharing a host are that host's local ranks."""

    name = "tf_config"
    required = ("TF_CONFIG",)

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        hint = (
            'TF_CONFIG is {"cluster": {"worker": ["host:port", ...]}, '
            '"task": {"type": "worker", "index": i}}'
        )
        try:
            config = json.loads(env["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ToolkitError(f"TF_CONFIG is not valid JSON ({error}).", hint) from None
        cluster = config.get("cluster") if isinstance(config, dict) else None
        task = config.get("task") if isinstance(config, dict) else None
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise ToolkitError("TF_CONFIG needs a 'cluster' and a 'task' object.", hint)
        chief = cluster.get("chief", [])
        workers = cluster.get("worker", [])
        task_type, index = task.get("type"), task.get("index")
        if task_type not in ("chief", "worker"):
            raise ToolkitError(
                f"TF_CONFIG task.type={task_type!r} is not supported: allowed are chief, worker.",
                "the toolkit's tf engine uses MultiWorkerMirroredStrategy, which has no "
                "parameter servers or evaluators",
            )
        members = chief if task_type == "chief" else workers
        if not isinstance(chief, list) or not isinstance(workers, list) or not members:
            raise ToolkitError(f"TF_CONFIG cluster.{task_type} is missing or not a list.", hint)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(members):
            raise ToolkitError(
                f"TF_CONFIG task.index={index!r} is not an index into cluster.{task_type} "
                f"({len(members)} entries).",
                hint,
            )
        hosts = tuple(str(address) for address in [*chief, *workers])
        rank = index if task_type == "chief" else len(chief) + index
        machines = [_split_host_port(address, "TF_CONFIG")[0] for address in hosts]
        master_addr, master_port = _split_host_port(hosts[0], "TF_CONFIG")
        this_machine = machines[rank]
        return LaunchEnvironment(
            launcher=cls.name,
            rank=rank,
            local_rank=machines[:rank].count(this_machine),
            world_size=len(hosts),
            local_world_size=machines.count(this_machine),
            node_rank=list(dict.fromkeys(machines)).index(this_machine),
            master_addr=master_addr,
            master_port=master_port,
            hosts=hosts,
        )


# Slurm reserves the top step ids for pseudo-steps (batch, extern, interactive), which are not a
# task launch by srun.
_SLURM_PSEUDO_STEP_IDS = 0xFFFFFFF0


class Srun(Detector):
    """Tasks started by `srun`. SLURM_PROCID alone does not mean srun: the batch step of an
    sbatch script and a bare salloc shell also carry SLURM_PROCID=0 and, with --ntasks,
    SLURM_NTASKS, so a plain `python train.py` in a batch script would wait forever for ranks
    that were never started. Only srun sets SLURM_STEP_ID, so it is required. The step's own
    node list and tasks per node are preferred over the job's, which differ when a step uses
    part of the allocation."""

    name = "srun"
    required = ("SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")

    @classmethod
    def claims(cls, env: Mapping[str, str]) -> bool:
        step = env["SLURM_STEP_ID"].strip()
        return step.isdigit() and int(step) < _SLURM_PSEUDO_STEP_IDS

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        node_rank = _int(env, "SLURM_NODEID")
        local_size_name, local_size = _slurm_local_size(env, node_rank)
        nodelist_name = next(
            (n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if env.get(n)), None
        )
        hosts = expand_hostlist(env[nodelist_name], nodelist_name) if nodelist_name else ()
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_world_size=local_size,
            node_rank=node_rank,
            master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else None),
            master_port=_port(env, "MASTER_PORT"),
            hosts=hosts,
        )
        sources = {
            "rank": "SLURM_PROCID",
            "local_rank": "SLURM_LOCALID",
            "world_size": "SLURM_NTASKS",
            "local_world_size": local_size_name,
            "node_rank": "SLURM_NODEID",
        }
        return _checked(environment, sources)


def _slurm_local_size(env: Mapping[str, str], node_rank: int) -> tuple[str, int]:
    """Tasks on this node from the step's tasks-per-node list ("2(x3),1" means 2,2,2,1)."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name):
            counts = expand_tasks_per_node(env[name], name)
            if node_rank >= len(counts):
                raise ToolkitError(
                    f"SLURM_NODEID={node_rank} has no entry in {name}={env[name]!r}.",
                    _STALE_HINT,
                )
            return name, counts[node_rank]
    if env.get("SLURM_NTASKS_PER_NODE"):
        return "SLURM_NTASKS_PER_NODE", _int(env, "SLURM_NTASKS_PER_NODE")
    raise ToolkitError(
        "srun set none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, "
        "SLURM_NTASKS_PER_NODE: the number of tasks on this node is unknown.",
        "start the job with srun --ntasks-per-node=N",
    )


class TorchEnv(Detector):
    """torch.distributed's env:// convention without a launcher marker: RANK and WORLD_SIZE
    set per process by an operator (Kubeflow's PyTorchJob runs one process per pod this way).
    The weakest signal, so it comes last: one process per machine unless LOCAL_RANK and
    LOCAL_WORLD_SIZE say otherwise."""

    name = "torch_env"
    required = ("RANK", "WORLD_SIZE")

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        rank = _int(env, "RANK")
        local_size = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1
        environment = LaunchEnvironment(
            launcher=cls.name,
            rank=rank,
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            world_size=_int(env, "WORLD_SIZE"),
            local_world_size=local_size,
            node_rank=rank // local_size if local_size else 0,
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_port(env, "MASTER_PORT"),
        )
        sources = {name.lower(): name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        sources |= {"local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "RANK // local size"}
        return _checked(environment, sources)


class Single(Detector):
    """No launcher: one process, rank 0 of 1."""

    name = "single"
    required = ()

    @classmethod
    def read(cls, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        return LaunchEnvironment(
            launcher=cls.name, rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0
        )


DETECTORS: tuple[type[Detector], ...] = (
    # Set per process by the toolkit's own launcher, whose run_launcher strips them from any
    # launch started inside a rank, so they are never an outer job's leftovers.
    ToolkitLocal,
    # HOROVOD_RANK is set only by horovodrun's Gloo mode, which copies its whole environment
    # into the ranks, so an enclosing job's RANK or SLURM_* can sit next to it.
    HorovodRun,
    # torchrun and the deepspeed launcher run once per node, often under srun or mpirun
    # (`srun torchrun ...`): their workers inherit the agent's SLURM_* / OMPI_*, which name
    # the node, not the worker. Both set RANK/LOCAL_RANK/WORLD_SIZE; torchrun is the one with
    # TORCHELASTIC_RUN_ID, so it goes first and DeepSpeed refuses when that is present.
    TorchRun,
    DeepSpeed,
    # mpirun usually runs inside an sbatch allocation and passes the batch step's SLURM_* on
    # to every rank, so MPI comes before Slurm. horovodrun --mpi and deepspeed's MPI back
    # ends land here. Open MPI and hydra never set each other's variables.
    OpenMPI,
    MPICH,
    # tf.distribute reads TF_CONFIG itself, so when it is present it is what the engine will
    # use; describing the process any other way would disagree with TensorFlow. It still
    # yields to the launchers above: none of their engines reads it, and a TF_CONFIG left
    # exported in a shell leaks into every process a launcher starts.
    TFConfig,
    # srun: after everything that can run inside a Slurm step.
    Srun,
    # Bare RANK/WORLD_SIZE: the weakest evidence, only when nothing more specific is there.
    TorchEnv,
    Single,
)

# Names a user may give explicitly: every detector by its own name, and each launcher by the
# environments its ranks may see (toolkit.engines.LAUNCHER_ENVIRONMENTS): horovodrun --mpi runs
# mpirun, and the deepspeed runner's multi-node back ends run mpirun, hydra or srun directly.
_BY_NAME: dict[str, type[Detector]] = {detector.name: detector for detector in DETECTORS}
LAUNCHERS: dict[str, tuple[type[Detector], ...]] = {
    **{name: (detector,) for name, detector in _BY_NAME.items()},
    **{
        launcher: tuple(_BY_NAME[environment] for environment in environments)
        for launcher, environments in LAUNCHER_ENVIRONMENTS.items()
    },
}


def detect_environment(
    env: Mapping[str, str], argv: Sequence[str], launcher: str | None = None
) -> LaunchEnvironment:
    """Describe this process from its environment and arguments (`os.environ`, `sys.argv`).

    With `launcher` unset, the first of `DETECTORS` that recognises the environment wins. With
    a launcher named (a key of `LAUNCHERS`), only its detectors are consulted, and if none has
    its variables the error names the ones that are missing.
    """
    if launcher is None:
        # Single ends the list and requires nothing, so some detector always answers.
        return next(e for d in DETECTORS if (e := d.detect(env, argv)) is not None)
    if launcher not in LAUNCHERS:
        raise ToolkitError(
            f"launcher {launcher!r} is unknown: allowed are {', '.join(sorted(LAUNCHERS))}.",
            "pick one of those, or leave the launcher unset to detect it",
        )
    candidates = LAUNCHERS[launcher]
    for detector in candidates:
        if not detector.missing(env):
            return detector.read(env, argv)
    missing = "; ".join(f"{d.name}: {', '.join(d.missing(env))}" for d in candidates)
    raise ToolkitError(
        f"launcher {launcher!r} was named but this process lacks its variables ({missing}).",
        f"start the script through {launcher}, or leave the launcher unset to detect it",
    )


_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def split_local_rank_arg(argv: Sequence[str]) -> tuple[list[str], int | None]:
    """Remove the first `--local_rank=N` / `--local_rank N` (or `--local-rank`) from an argv
    list, as the deepspeed launcher appends it, and return the rest and N (None if absent).
    Scripts that parse their own arguments call this on sys.argv first."""
    args = list(argv)
    for position, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag not in _LOCAL_RANK_FLAGS:
            continue
        width = 1
        if not equals:
            value = args[position + 1] if position + 1 < len(args) else ""
            width = 2
        if not value.isdigit():
            raise ToolkitError(
                f"{flag} needs a non-negative integer, got {value!r}.",
                f"write {flag}=N, or leave it to the launcher",
            )
        del args[position : position + width]
        return args, int(value)
    return args, None
