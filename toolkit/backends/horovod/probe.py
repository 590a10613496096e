"""Doctor probe for Horovod: which frameworks, controllers and tensor operations it was built with.

The same facts `horovodrun --check-build` prints, read through the Python API so that a broken
build (for example one compiled against another torch, which fails with an undefined symbol)
is reported per framework instead of as a crash.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from toolkit.doctor.probe_protocol import (
    REINSTALL_FIX,
    GpuSupport,
    ProbeReport,
    Problem,
    not_installed,
    run_probe,
)

FRAMEWORK_MODULES = {"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}
BUILD_FLAGS = ("mpi", "gloo", "nccl", "ddl", "ccl", "cuda", "rocm")

KERAS3_FINDING = (
    "horovod.tensorflow.keras (the Keras 2 API) does not work with Keras 3 "
    "(upstream horovod issue 4290: Keras 3 variables have no .ref())"
)
KERAS3_FIX = (
    "use toolkit's horovod backend with framework: tensorflow (it takes gradients w.r.t. "
    "v.value), or pip install tf-keras and export TF_USE_LEGACY_KERAS=1"
)


def probe() -> ProbeReport:
    try:
        import horovod
    except ImportError as error:
        return not_installed("horovod", "horovod", error)
    report = ProbeReport(engine="horovod", installed=True, version=horovod.__version__)
    frameworks: list[str] = []
    built_with: dict[str, bool] = {}
    for framework, module_name in FRAMEWORK_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # an undefined symbol is an ImportError, but not always
            report.problems.append(
                Problem(f"{module_name} fails to import: {error}", _rebuild_fix())
            )
            continue
        frameworks.append(framework)
        built_with = built_with or _build_flags(module)
    report.details = {
        "frameworks": frameworks,
        "controllers": [name for name in ("mpi", "gloo") if built_with.get(name)],
        "tensor_operations": [
            name.upper() for name in ("nccl", "ddl", "ccl", "mpi", "gloo") if built_with.get(name)
        ],
        "gpu": [name for name in ("cuda", "rocm") if built_with.get(name)],
    }
    if built_with:
        report.gpu = gpu_support(built_with)
    if frameworks and not report.details["controllers"]:
        report.problems.append(
            Problem("Horovod was built with neither MPI nor Gloo", _rebuild_fix())
        )
    if "tensorflow" in frameworks and _keras_major() >= 3:
        report.problems.append(Problem(KERAS3_FINDING, KERAS3_FIX, blocking=False))
    return report


def gpu_support(built_with: dict[str, bool]) -> GpuSupport:
    """Horovod's GPU side from its build flags (`hvd.cuda_built()`, `hvd.nccl_built()`, ...):
    whether it reduces GPU tensors, and with NCCL or through MPI or Gloo."""
    gpu = [name.upper() for name in ("cuda", "rocm") if built_with[name]]
    if not gpu:
        summary = "CPU-only build (no CUDA, no NCCL): GPU tensors are not supported"
    elif built_with["nccl"]:
        summary = f"built with {gpu[0]} and NCCL: GPU tensors are reduced with NCCL"
    else:
        summary = f"built with {gpu[0]} but without NCCL: GPU tensors go through MPI or Gloo"
    return GpuSupport(bool(gpu), None, summary, {"built_with": built_with})


def _build_flags(module: ModuleType) -> dict[str, bool]:
    return {flag: bool(getattr(module, f"{flag}_built")()) for flag in BUILD_FLAGS}


def _keras_major() -> int:
    try:
        import keras
    except ImportError:
        return 0
    return int(str(keras.__version__).split(".")[0])


def _rebuild_fix() -> str:
    return f"rm -rf ~/.cache/toolkit/wheels/horovod-* && {REINSTALL_FIX}"


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
