"""Doctor probe for TensorFlow and the Keras it ships."""

from __future__ import annotations

import os

from toolkit.doctor.probe_protocol import ProbeReport, not_installed, run_probe

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
    )


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
