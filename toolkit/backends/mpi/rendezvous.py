"""Agree on a master address and port through MPI, for engines started by plain `mpirun`.

mpirun tells a process its rank but not where rank 0 listens; torch.distributed (DDP,
DeepSpeed) and TF's MultiWorkerMirroredStrategy need exactly that. Rank 0 picks a free port on
its own address and broadcasts both over MPI_COMM_WORLD.
"""

from __future__ import annotations

import socket

from toolkit.launch.supervisor import free_port


def rank0_address(*, single_host: bool) -> tuple[str, int]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    chosen: tuple[str, int] | None = None
    if comm.Get_rank() == 0:
        address = "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())
        chosen = (address, free_port(address))
    address, port = comm.bcast(chosen, root=0)
    return str(address), int(port)


def gather_addresses(*, single_host: bool, port: int) -> list[str]:
    """Every rank's "host:port" in rank order (TF_CONFIG's worker list under mpirun)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    address = "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())
    own = f"{address}:{free_port(address) if single_host else port}"
    return [str(item) for item in comm.allgather(own)]
