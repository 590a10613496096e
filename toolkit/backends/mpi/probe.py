"""Doctor probe for the MPI library (through mpi4py) that Horovod and mpirun use."""

from __future__ import annotations

from toolkit.doctor.probe_protocol import ProbeReport, not_installed, run_probe


def probe() -> ProbeReport:
    try:
        import mpi4py

        # Importing MPI initialises the library; a missing libmpi fails here, not above.
        from mpi4py import MPI
    except (ImportError, RuntimeError) as error:
        return not_installed("mpi", "mpi4py (with an MPI library)", error)
    library = MPI.Get_library_version().strip().splitlines()[0]
    major, minor = MPI.Get_version()
    return ProbeReport(
        engine="mpi",
        installed=True,
        version=mpi4py.__version__,
        details={
            "implementation": _implementation(library),
            "library": library.split(",")[0],
            "mpi_standard": f"{major}.{minor}",
        },
    )


def _implementation(library: str) -> str:
    for name in ("Open MPI", "MPICH", "Intel(R) MPI", "MVAPICH"):
        if name.lower() in library.lower():
            return name
    return "unknown"


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
