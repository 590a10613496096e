"""TrainSpec -> hostfile text in the deepspeed launcher's (and Open MPI's) "name slots=N" form."""

from __future__ import annotations

from toolkit.render.layout import job_hosts
from toolkit.spec import TrainSpec


def hostfile(spec: TrainSpec) -> str:
    """One "name slots=N" line per host; this machine with np slots when there are no hosts."""
    return "".join(f"{host.name} slots={host.slots}\n" for host in job_hosts(spec))
