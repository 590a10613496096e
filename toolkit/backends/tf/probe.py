"""Doctor probe for TensorFlow, the Keras it ships and its CUDA side."""

from __future__ import annotations

import os
from types import ModuleType

from toolkit.doctor.probe_protocol import GpuSupport, ProbeReport, not_installed, run_probe

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def probe() -> ProbeReport:
    try:
        import tensorflow as tf
    except ImportError as error:
        return not_installed("tensorflow", "tensorflow", error)
    keras_version = getattr(tf.keras, "__version__", None) or _keras_version()
    return ProbeReport(
        engine="tensorflow",
        installed=True,
        version=tf.__version__,
        details={
            "keras": keras_version,
            "devices": [d.name for d in tf.config.list_physical_devices()],
            "built_with_cuda": tf.test.is_built_with_cuda(),
            "strategies": ["MirroredStrategy", "MultiWorkerMirroredStrategy"],
        },
        gpu=gpu_support(tf),
    )


def gpu_support(tf: ModuleType) -> GpuSupport:
    """Whether this TensorFlow was built with CUDA (and which CUDA and cuDNN), and the GPUs it
    lists here."""
    if not tf.test.is_built_with_cuda():
        return GpuSupport(False, 0, "CPU-only build (tf.test.is_built_with_cuda() is False)")
    build = tf.sysconfig.get_build_info()
    devices = len(tf.config.list_physical_devices("GPU"))
    facts = {key: build.get(key) for key in ("cuda_version", "cudnn_version")}
    seen = f"{devices} GPU{'' if devices == 1 else 's'}" if devices else "no GPU visible"
    summary = f"CUDA {facts['cuda_version']}, cuDNN {facts['cudnn_version']} build; {seen}"
    return GpuSupport(True, devices, summary, facts)


def _keras_version() -> str | None:
    try:
        import keras
    except ImportError:
        return None
    return str(keras.__version__)


def main() -> None:
    run_probe(probe)


if __name__ == "__main__":
    main()
