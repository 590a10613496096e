"""Doctor probe for PyTorch (the ddp and fsdp engines): its torch.distributed transports, FSDP2's
`fully_shard` and its CUDA side."""

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
            "fully_shard": _has_fully_shard(),
        },
        gpu=gpu_support(torch),
    )
    if not transports["gloo"]:
        report.problems.append(
            Problem("torch.distributed has no gloo transport; DDP on CPU needs it", "make setup")
        )
    if not report.details["fully_shard"]:
        report.problems.append(
            Problem(
                f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2): "
                "backend fsdp cannot run",
                "install torch 2.6 or newer: make setup",
            )
        )
    return report


def _has_fully_shard() -> bool:
    """FSDP2 and the distributed checkpoint state-dict API the fsdp backend reads through."""
    try:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


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
