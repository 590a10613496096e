"""TrainSpec -> Horovod's settings: the horovodrun config file, HOROVOD_* env, optimizer options.

Pure: imports no engine. The config file is the YAML `horovodrun --config-file` reads
(horovod/runner/common/util/config_parser.py): snake_case keys under `params`, `autotune`,
`timeline`, not the dashed command-line spellings. `HOROVOD_FUSION_THRESHOLD` is in bytes, while
the config file and `--fusion-threshold-mb` take MiB. Compression and the reduction op are not
launcher settings: they are arguments of `hvd.DistributedOptimizer` / `DistributedGradientTape`,
so they come out as data for the backend (`optimizer_options`).
"""

from __future__ import annotations

from typing import Any

from toolkit.engines import Controller
from toolkit.spec import TrainSpec
from toolkit.units import MIB


def config_file(spec: TrainSpec) -> dict[str, Any]:
    """The data of a `horovodrun --config-file` YAML file."""
    hvd = spec.horovod
    data: dict[str, Any] = {
        "controller": hvd.controller,
        "params": {
            "fusion_threshold_mb": hvd.fusion_threshold,
            "cycle_time_ms": hvd.cycle_time,
            "cache_capacity": hvd.cache_capacity,
            "hierarchical_allreduce": hvd.hierarchical_allreduce,
            "hierarchical_allgather": hvd.hierarchical_allgather,
        },
        "autotune": {"enabled": hvd.autotune},
    }
    if hvd.timeline:
        data["timeline"] = {"filename": hvd.timeline, "mark_cycles": False}
    return data


def environment(spec: TrainSpec, controller: Controller | None = None) -> dict[str, str]:
    """HOROVOD_* variables with the same settings, for ranks started without horovodrun; with
    `controller`, for ranks a launcher started for that controller, whatever the spec says.

    Under the MPI controller also Open MPI's `mpi_yield_when_idle`, which every launcher passes
    on (Open MPI reads OMPI_MCA_* from a rank's environment, and mpirun, horovodrun's too,
    forwards its own). Horovod's background thread negotiates in an MPI collective every
    cycle, and with Open MPI's default a rank that arrives first polls a whole core until its
    peer joins, the core its compute needs when ranks fill the cores. Yielding lets the
    compute thread have the core; the sums are the same (docs/engine-notes.md, Horovod).
    """
    hvd = spec.horovod if controller is None else spec.horovod.running(controller)
    env = {
        "HOROVOD_CONTROLLER": hvd.controller,
        "HOROVOD_CPU_OPERATIONS": hvd.controller,
        "HOROVOD_FUSION_THRESHOLD": str(hvd.fusion_threshold * MIB),
        "HOROVOD_CYCLE_TIME": str(hvd.cycle_time),
        "HOROVOD_CACHE_CAPACITY": str(hvd.cache_capacity),
        "HOROVOD_HIERARCHICAL_ALLREDUCE": str(int(hvd.hierarchical_allreduce)),
        "HOROVOD_HIERARCHICAL_ALLGATHER": str(int(hvd.hierarchical_allgather)),
    }
    if hvd.controller == "mpi":
        env["OMPI_MCA_mpi_yield_when_idle"] = str(int(hvd.mpi_yield_when_idle))
    if hvd.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if hvd.timeline:
        env["HOROVOD_TIMELINE"] = hvd.timeline
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "0"
    return env


def horovodrun_flags(spec: TrainSpec) -> list[str]:
    """horovodrun's controller and tuning flags, each setting explicit in both directions."""
    hvd = spec.horovod
    flags = [
        f"--{hvd.controller}",
        "--fusion-threshold-mb",
        str(hvd.fusion_threshold),
        "--cycle-time-ms",
        str(hvd.cycle_time),
        "--cache-capacity",
        str(hvd.cache_capacity),
        "--hierarchical-allreduce" if hvd.hierarchical_allreduce else "--no-hierarchical-allreduce",
        "--hierarchical-allgather" if hvd.hierarchical_allgather else "--no-hierarchical-allgather",
        "--autotune" if hvd.autotune else "--no-autotune",
    ]
    if hvd.timeline:
        flags += ["--timeline-filename", hvd.timeline, "--no-timeline-mark-cycles"]
    return flags


def optimizer_options(spec: TrainSpec, world_size: int | None = None) -> dict[str, Any]:
    """Arguments for hvd.DistributedOptimizer, named as Horovod names them.

    backward_passes_per_step makes Horovod accumulate locally and allreduce once per step,
    which is the spec's accumulation.
    """
    return {
        "compression": {"none": "Compression.none", "fp16": "Compression.fp16"}[
            spec.wire_compression
        ],
        "op": {"average": "Average", "sum": "Sum", "adasum": "Adasum"}[spec.horovod.op],
        "backward_passes_per_step": spec.batch_for(world_size).accumulation,
        "gradient_predivide_factor": 1.0,
    }
