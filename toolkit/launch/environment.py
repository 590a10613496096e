"""Which launcher started this process, and what it says about the process's place in the job.

Each launcher announces rank, world size and so on in its own environment variables. A
`Detector` knows one launcher's variables; `DETECTORS` lists them in the order they are tried,
and the first that recognises the environment describes the process as a `LaunchEnvironment`.
Most detectors are data: which variable holds which fact, read by one routine
(`toolkit.launch.detectors.Variables`); code exists only where a launcher differs.
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

from collections.abc import Mapping, Sequence

from toolkit.engines import LAUNCHER_ENVIRONMENTS
from toolkit.errors import ToolkitError
from toolkit.launch.detectors import (
    DeepSpeedVariables,
    Detector,
    LaunchEnvironment,
    Single,
    Variables,
    script_args,
    split_local_rank_arg,
)
from toolkit.launch.slurm import SlurmVariables
from toolkit.launch.tf_config import TFConfig
from toolkit.rank_variables import (
    TOOLKIT_LOCAL_RANK,
    TOOLKIT_MASTER_ADDR,
    TOOLKIT_MASTER_PORT,
    TOOLKIT_RANK,
    TOOLKIT_WORLD_SIZE,
)

__all__ = [
    "DETECTORS",
    "LAUNCHERS",
    "LaunchEnvironment",
    "detect_environment",
    "script_args",
    "split_local_rank_arg",
]

DETECTORS: tuple[Detector, ...] = (
    # The toolkit's own local launcher: one machine, so the local size is the world size. Its
    # run_launcher strips these from any launch started inside a rank, so they are never an
    # outer job's leftovers.
    Variables(
        name="local",
        rank=TOOLKIT_RANK,
        world_size=TOOLKIT_WORLD_SIZE,
        local_rank=TOOLKIT_LOCAL_RANK,
        local_world_size=TOOLKIT_WORLD_SIZE,
        master_addr=TOOLKIT_MASTER_ADDR,
        master_port=TOOLKIT_MASTER_PORT,
    ),
    # `horovodrun --gloo`: HOROVOD_RANK is set only by its Gloo mode, which copies its whole
    # environment into the ranks, so an enclosing job's RANK or SLURM_* can sit next to it. The
    # master address and port are horovodrun's own Gloo rendezvous server.
    Variables(
        name="horovodrun",
        rank="HOROVOD_RANK",
        world_size="HOROVOD_SIZE",
        local_rank="HOROVOD_LOCAL_RANK",
        local_world_size="HOROVOD_LOCAL_SIZE",
        node_rank="HOROVOD_CROSS_RANK",
        master_addr="HOROVOD_GLOO_RENDEZVOUS_ADDR",
        master_port="HOROVOD_GLOO_RENDEZVOUS_PORT",
    ),
    # torchrun and the deepspeed launcher run once per node, often under srun or mpirun
    # (`srun torchrun ...`): their workers inherit the agent's SLURM_* / OMPI_*, which name
    # the node, not the worker. Both set RANK/LOCAL_RANK/WORLD_SIZE; torchrun is the one with
    # TORCHELASTIC_RUN_ID, so it goes first and DeepSpeed steps aside when that is present
    # (`deepspeed --elastic_training` runs torch's elastic agent: torchrun, same meaning).
    Variables(
        name="torchrun",
        markers=("TORCHELASTIC_RUN_ID",),
        rank="RANK",
        world_size="WORLD_SIZE",
        local_rank="LOCAL_RANK",
        local_world_size="LOCAL_WORLD_SIZE",
        node_rank="GROUP_RANK",
    ),
    DeepSpeedVariables(
        name="deepspeed",
        rank="RANK",
        world_size="WORLD_SIZE",
        local_rank="LOCAL_RANK",
        local_world_size="LOCAL_SIZE",
        node_rank="CROSS_RANK",
        defaults={"CROSS_RANK": 0},
        excluded_by=("TORCHELASTIC_RUN_ID",),
    ),
    # mpirun usually runs inside an sbatch allocation and passes the batch step's SLURM_* on
    # to every rank, so MPI comes before Slurm. horovodrun --mpi and deepspeed's MPI back
    # ends land here. Open MPI and hydra never set each other's variables, and neither names
    # the node. MASTER_ADDR/PORT are read when the job exported them (mpirun -x).
    Variables(
        name="openmpi",
        rank="OMPI_COMM_WORLD_RANK",
        world_size="OMPI_COMM_WORLD_SIZE",
        local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
        local_world_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    # MPICH's and Intel MPI's hydra launcher (mpiexec / mpirun). Slurm's PMI2 plugin sets
    # PMI_RANK too but not MPI_LOCALRANKID, so `srun --mpi=pmi2` falls through to srun.
    Variables(
        name="mpich",
        rank="PMI_RANK",
        world_size="PMI_SIZE",
        local_rank="MPI_LOCALRANKID",
        local_world_size="MPI_LOCALNRANKS",
    ),
    # tf.distribute reads TF_CONFIG itself, so when it is present it is what the engine will
    # use; describing the process any other way would disagree with TensorFlow. It still
    # yields to the launchers above: none of their engines reads it, and a TF_CONFIG left
    # exported in a shell leaks into every process a launcher starts.
    TFConfig(),
    # srun: after everything that can run inside a Slurm step.
    SlurmVariables(
        name="srun",
        markers=("SLURM_STEP_ID",),
        rank="SLURM_PROCID",
        world_size="SLURM_NTASKS",
        local_rank="SLURM_LOCALID",
        local_world_size=None,
        node_rank="SLURM_NODEID",
    ),
    # torch.distributed's env:// convention without a launcher marker: RANK and WORLD_SIZE set
    # per process by an operator (Kubeflow's PyTorchJob runs one process per pod this way).
    # The weakest evidence, so it comes last: one process per machine unless LOCAL_RANK and
    # LOCAL_WORLD_SIZE say otherwise.
    Variables(
        name="torch_env",
        rank="RANK",
        world_size="WORLD_SIZE",
        local_rank="LOCAL_RANK",
        local_world_size="LOCAL_WORLD_SIZE",
        defaults={"LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1},
    ),
    Single(),
)

# Names a user may give explicitly: every detector by its own name, and each launcher by the
# environments its ranks may see (toolkit.engines.LAUNCHER_ENVIRONMENTS): horovodrun --mpi runs
# mpirun, and the deepspeed runner's multi-node back ends run mpirun, hydra or srun directly.
_BY_NAME: dict[str, Detector] = {detector.name: detector for detector in DETECTORS}
LAUNCHERS: dict[str, tuple[Detector, ...]] = {
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
