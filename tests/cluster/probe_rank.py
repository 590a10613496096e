"""Print the variables that place this process in a job, as one JSON line.

Standard library only, so it runs under any interpreter on any "host" a launcher reaches.
`toolkit.launch.probe` reports what the toolkit makes of these variables; this reports the
variables themselves, plus "host": the address an ssh test host was reached on
(TOOLKIT_TEST_SSH_HOST, set by the test sshd) or else the machine's name, and "argv".
"""

from __future__ import annotations

import json
import os
import socket
import sys

NAMES = (
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "TF_CONFIG",
)
PREFIXES = ("HOROVOD_", "TOOLKIT_")


def report() -> dict[str, object]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name in NAMES or name.startswith(PREFIXES)
    }
    host = os.environ.get("TOOLKIT_TEST_SSH_HOST") or socket.gethostname()
    return {"host": host, "argv": sys.argv[1:], "env": env}


if __name__ == "__main__":
    # One write call: ranks often share the launcher's pipe, and one small write is atomic.
    os.write(sys.stdout.fileno(), (json.dumps(report(), sort_keys=True) + "\n").encode())
