"""Horovod settings shared by its torch and TensorFlow backends (no framework import here)."""

from __future__ import annotations

import os
import sys

from toolkit.engines import Controller
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.render import horovod as render_horovod
from toolkit.spec import TrainSpec


def export_environment(spec: TrainSpec, env: LaunchEnvironment) -> None:
    """Set HOROVOD_* from the spec before hvd.init(), whichever launcher started the ranks.

    horovodrun already passes the same settings as flags; setting them again here is what makes
    plain `mpirun` runs use the spec's fusion, cycle time and cache too. The controller is the
    one the launcher started the ranks for, whatever the spec says: ranks that see horovodrun's
    variables were started by `horovodrun --gloo` (its MPI mode sets none, its ranks are plain
    MPI processes), and any other launcher has no Gloo rendezvous server, so MPI. That changes
    who coordinates, not the math; a written controller that disagrees gets a warning.
    """
    running: Controller = "gloo" if env.launcher == "horovodrun" else "mpi"
    written = spec.horovod.controller_setting
    if written is not None and written != running and env.rank == 0 and env.world_size > 1:
        print(
            f"toolkit: horovod.controller={written!r}, but {env.launcher} started the ranks "
            f"for the {running} controller; Horovod uses {running}",
            file=sys.stderr,
        )
    settings = render_horovod.environment(spec, running)
    # A dead or stalled peer ends the job after the spec's collective timeout: Gloo's operations
    # give up then, and Horovod's stall inspector shuts down ranks still waiting for a peer's
    # tensors (its check runs at half that period, so it warns before it shuts down).
    timeout = spec.timeouts.collective_s
    settings.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, round(timeout))))
    settings.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, round(timeout / 2))))
    settings.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(1, round(timeout))))
    if env.world_size == 1:
        # hvd.init() alone, with no launcher, runs one process over Gloo.
        settings.pop("HOROVOD_CONTROLLER")
        settings.pop("HOROVOD_CPU_OPERATIONS")
    os.environ.update(settings)


def check_world_size(horovod_size: int, env: LaunchEnvironment) -> None:
    """Horovod's own count of ranks must be the one the launcher announced."""
    if horovod_size != env.world_size:
        raise ToolkitError(
            f"Horovod sees {horovod_size} ranks but the launcher ({env.launcher}) "
            f"announced {env.world_size}",
            "start every rank through the same horovodrun or mpirun",
        )
