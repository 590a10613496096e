"""The communication options name real tf.distribute values (TensorFlow as the oracle).

TensorFlow sets environment variables when imported, so it is imported at module level (before
the environment-leak fixture starts watching), like the other TF tests.
"""

from __future__ import annotations

import os

import pytest

from toolkit.render import tf as render_tf
from toolkit.spec import TrainSpec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tensorflow = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("name", ["ring", "nccl", "auto"])
def test_options_build_tf_communication_options(name: str) -> None:
    spec = TrainSpec.from_dict({"backend": "tf", "tf": {"communication": name}})
    options = render_tf.communication_options(spec)
    experimental = tensorflow.distribute.experimental
    implementation = getattr(experimental.CommunicationImplementation, options["implementation"])
    built = experimental.CommunicationOptions(implementation=implementation)
    assert built.implementation == implementation
