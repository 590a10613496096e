"""Doctor probe for PyTorch and its torch.distributed transports."""

from __future__ import annotations

from toolkit.doctor.probe_protocol import ProbeReport, Problem, not_installed, run_probe


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
    )
    if not transports["gloo"]:
        report.problems.append(
            Problem("torch.distributed has no gloo transport; DDP on CPU needs it", "make setup")
        )
    return report


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
