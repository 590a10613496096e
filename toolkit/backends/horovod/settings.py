"""Horovod settings shared by its torch and TensorFlow backends (no framework import here)."""

from __future__ import annotations

import os
import sys

from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.render import horovod as render_horovod
from toolkit.spec import TrainSpec


def export_environment(spec: TrainSpec, env: LaunchEnvironment) -> None:
    """Set HOROVOD_* from the spec before hvd.init(), whichever launcher started the ranks.

    horovodrun already passes the same settings as flags; setting them again here is what makes
    plain `mpirun` runs use the spec's fusion, cycle time and cache too. Under mpirun there is no
    Gloo rendezvous server, so the controller is necessarily MPI whatever the spec says: that
    changes who coordinates, not the math.
    """
    settings = render_horovod.environment(spec)
    if env.launcher != "horovodrun":
        written = spec.horovod.controller_setting
        if written is not None and written != "mpi" and env.rank == 0 and env.world_size > 1:
            print(
                f"toolkit: horovod.controller={written!r} needs horovodrun; "
                f"under {env.launcher} Horovod uses its MPI controller",
                file=sys.stderr,
            )
        settings["HOROVOD_CONTROLLER"] = "mpi"
        settings["HOROVOD_CPU_OPERATIONS"] = "mpi"
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
