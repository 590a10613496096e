"""Doctor probe for DeepSpeed: version, the accelerator it picked, its communication backend."""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path
from typing import Any

from toolkit.doctor.probe_protocol import (
    GpuSupport,
    ProbeReport,
    Problem,
    not_installed,
    run_probe,
)

# A JIT build of a DeepSpeed op takes about a minute here; a lock older than this is stale.
STALE_LOCK_SECONDS = 600


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
            "compiled_ops": _compiled_ops(),
        },
        gpu=gpu_support(accelerator),
    )
    report.problems += [
        Problem(
            f"stale JIT build lock {lock}: a killed build left it, and every DeepSpeed start "
            "that builds this op waits on it forever",
            f"rm {lock}   (when no DeepSpeed job is running)",
        )
        for lock in stale_build_locks()
    ]
    if not report.details["pipeline_engine"]:
        report.problems.append(
            Problem("deepspeed.pipe.PipelineModule is not importable", "make setup")
        )
    return report


def stale_build_locks(now: float | None = None) -> list[Path]:
    """Lock files in torch's extension cache older than any real build takes.

    torch's JIT builds (DeepSpeed's cpu_adam for offload, for one) hold `<op>/lock` while they
    compile and wait for it without a timeout; a build killed mid-way never removes it.
    """
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or _default_extensions_root())
    cutoff = (time.time() if now is None else now) - STALE_LOCK_SECONDS
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")]
    return sorted(lock for lock in locks if lock.stat().st_mtime < cutoff)


def _default_extensions_root() -> str:
    from torch.utils.cpp_extension import get_default_build_root

    return str(get_default_build_root())


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _compiled_ops() -> list[str]:
    """The ops built into the installed package (scripts/build_deepspeed.sh); the others are
    compiled on first use into torch's extension cache."""
    from deepspeed.git_version_info import installed_ops

    return sorted(name for name, built in installed_ops.items() if built)


def gpu_support(accelerator: Any) -> GpuSupport:
    """The accelerator DeepSpeed picked here, what its installed ops were built for, and which
    are prebuilt; read from the package's build record, so no op is compiled to find out."""
    import torch
    from deepspeed import git_version_info

    name = accelerator.device_name()
    devices = 0 if name == "cpu" else int(accelerator.device_count())
    built = torch.version.cuda is not None
    built_for = getattr(git_version_info, "accelerator_name", "") or "unknown"
    ops = _compiled_ops()
    facts = {"accelerator": name, "ops_built_for": built_for, "prebuilt_ops": ops}
    seen = "" if name == "cpu" else f", {devices} device{'' if devices == 1 else 's'}"
    summary = (
        ("" if built else "CPU-only build (its torch has no CUDA); ")
        + f"accelerator {name} ({accelerator.communication_backend_name()}){seen}; ops prebuilt "
        f"for {built_for}: {', '.join(ops) or 'none'} (the others compile on first use)"
    )
    return GpuSupport(built, devices, summary, facts)


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
