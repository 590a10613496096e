"""The workers and parameter servers of a ParameterServerStrategy job: TensorFlow's server,
until the chief has gone.

TensorFlow's servers never stop on their own; its guide leaves ending them to the cluster
manager. Here each one watches the chief's address instead: it waits up to `wait_s` for the
chief to listen, and exits with status 0 once the chief has stopped listening for
`CHIEF_GONE_S`, however the chief ended. The chief's exit status is the job's.

Under mpirun the chief's exit waits in MPI_Finalize for every rank to finalize too, so there a
server finalizes MPI once the chief listens (`end_together`), and exits when that returns: at
the chief's exit. A chief that fails without finalizing is mpirun's to end the job.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from toolkit.backends.tf.common import tf

POLL_S = 0.5
CHIEF_GONE_S = 2.0
"""How long the chief's port must stay closed before a server takes the chief for gone."""


def serve_until_chief_leaves(
    resolver: Any, wait_s: float, end_together: Callable[[], None] | None = None
) -> NoReturn:
    """Serve this rank's task of the resolver's cluster; end the process when the chief goes,
    or when `end_together` returns (module docs)."""
    cluster = resolver.cluster_spec()
    role = f"{resolver.task_type} {resolver.task_id}"
    tf.distribute.Server(
        cluster,
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    chief = cluster.task_address("chief", 0)
    host, _, port = chief.rpartition(":")
    started = time.monotonic()
    while not _listening(host, int(port)):
        if time.monotonic() - started > wait_s:
            _leave(
                1,
                f"tf parameter servers: {role} waited {wait_s:g} s (timeouts.collective_s) "
                f"for the chief at {chief}, which never listened; the chief (rank 0) failed "
                "to start or is unreachable",
            )
        time.sleep(POLL_S)
    if end_together is not None:
        end_together()
        _leave(0, "")
    gone_since: float | None = None
    while True:
        time.sleep(POLL_S)
        if _listening(host, int(port)):
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since > CHIEF_GONE_S:
            _leave(0, "")


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def _leave(status: int, message: str) -> NoReturn:
    """Exit now: TensorFlow's server threads would keep an orderly exit waiting for ever."""
    if message:
        print(f"error: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
