"""Doctor probe for DeepSpeed: version, the accelerator it picked, its communication backend."""

from __future__ import annotations

import contextlib
import io

from toolkit.doctor.probe_protocol import ProbeReport, Problem, not_installed, run_probe


def probe() -> ProbeReport:
    # DeepSpeed logs its accelerator choice on stdout at import; keep the probe's stdout JSON.
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise):
            import deepspeed
            from deepspeed.accelerator import get_accelerator

            accelerator = get_accelerator()
    except ImportError as error:
        return not_installed("deepspeed", "deepspeed", error)
    report = ProbeReport(
        engine="deepspeed",
        installed=True,
        version=deepspeed.__version__,
        details={
            "accelerator": accelerator.device_name(),
            "communication_backend": accelerator.communication_backend_name(),
            "torch": deepspeed.__dict__.get("__torch_version__", _torch_version()),
            "pipeline_engine": _has_pipeline_engine(),
        },
    )
    if not report.details["pipeline_engine"]:
        report.problems.append(
            Problem("deepspeed.pipe.PipelineModule is not importable", "make setup")
        )
    return report


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _has_pipeline_engine() -> bool:
    try:
        from deepspeed.pipe import PipelineModule  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
