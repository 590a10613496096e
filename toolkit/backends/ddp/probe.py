"""Doctor probe for PyTorch, its torch.distributed transports and its CUDA side."""

from __future__ import annotations

from types import ModuleType

from toolkit.doctor.probe_protocol import (
    GpuSupport,
    ProbeReport,
    Problem,
    not_installed,
    run_probe,
)


def probe() -> ProbeReport:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        return not_installed("torch", "torch", error)
    transports = {
        "gloo": dist.is_gloo_available(),
        "mpi": dist.is_mpi_available(),
        "nccl": dist.is_nccl_available(),
    }
    report = ProbeReport(
        engine="torch",
        installed=True,
        version=torch.__version__,
        details={
            "cuda": torch.version.cuda or False,
            "distributed_transports": [name for name, ok in transports.items() if ok],
            "threads": torch.get_num_threads(),
        },
        gpu=gpu_support(torch),
    )
    if not transports["gloo"]:
        report.problems.append(
            Problem("torch.distributed has no gloo transport; DDP on CPU needs it", "make setup")
        )
    return report


def gpu_support(torch: ModuleType) -> GpuSupport:
    """torch's CUDA build, the GPUs it sees and its NCCL, or that it is a CPU-only build."""
    cuda = torch.version.cuda
    if cuda is None:
        return GpuSupport(False, 0, "CPU-only build (torch.version.cuda is None)")
    available = bool(torch.cuda.is_available())
    devices = int(torch.cuda.device_count()) if available else 0
    nccl = _nccl_version(torch)
    facts = {"cuda": cuda, "is_available": available, "nccl": nccl}
    seen = f"{devices} GPU{'' if devices == 1 else 's'}" if available else "no GPU visible"
    summary = f"CUDA {cuda} build; {seen}; NCCL {nccl or 'not built'}"
    return GpuSupport(True, devices, summary, facts)


def _nccl_version(torch: ModuleType) -> str | None:
    """The NCCL torch was built with, "2.21.5"; None where it has none."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
