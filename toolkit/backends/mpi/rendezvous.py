"""Agree on a master address and port through MPI, for engines started by plain `mpirun`.

mpirun tells a process its rank but not where rank 0 listens; torch.distributed (DDP,
DeepSpeed) and TF's MultiWorkerMirroredStrategy need exactly that. Rank 0 picks a free port on
its own address and broadcasts both over MPI_COMM_WORLD.
"""

from __future__ import annotations

import socket

from toolkit.ports import free_port


def own_address(*, single_host: bool) -> str:
    """Loopback when every rank is on this machine, else this host's address."""
    return "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())


def rank0_address(*, single_host: bool) -> tuple[str, int]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    chosen: tuple[str, int] | None = None
    if comm.Get_rank() == 0:
        address = own_address(single_host=single_host)
        chosen = (address, free_port(address))
    address, port = comm.bcast(chosen, root=0)
    return str(address), int(port)


def gather_addresses(*, single_host: bool, port: int) -> list[str]:
    """Every rank's "host:port" in rank order (TF_CONFIG's worker list under mpirun)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    address = own_address(single_host=single_host)
    own = f"{address}:{free_port(address) if single_host else port}"
    return [str(item) for item in comm.allgather(own)]


def wait_for_every_rank_to_finish() -> None:
    """MPI_Finalize, which returns once every rank has called it: a rank that only serves
    others (a parameter server) waits here for the rank that drives the job to exit, which
    finalizes at its exit (mpi4py's default), and neither waits on the other for ever."""
    from mpi4py import MPI

    MPI.Finalize()
