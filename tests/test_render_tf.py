"""TF_CONFIG per worker and MultiWorkerMirroredStrategy communication options."""

from __future__ import annotations

import json

import pytest

from toolkit.render import tf
from toolkit.spec import SpecError, TrainSpec


def test_tf_config_per_worker() -> None:
    spec = TrainSpec.from_dict({"backend": "tf", "launch": {"np": 3}, "tf": {"port": 20000}})
    configs = [json.loads(text) for text in tf.tf_configs(spec)]
    workers = ["localhost:20000", "localhost:20001", "localhost:20002"]
    assert [c["cluster"]["worker"] for c in configs] == [workers] * 3
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    with pytest.raises(SpecError):
        tf.tf_config(spec, 3)


def test_worker_ports_are_unique_across_hosts() -> None:
    """Hosts sharing a machine (containers, the loopback test hosts) must not collide."""
    spec = TrainSpec.from_dict(
        {"backend": "tf", "launch": {"launcher": "srun", "hosts": ["n1:2", "n2:2"]}}
    )
    assert tf.worker_addresses(spec) == ["n1:12345", "n1:12346", "n2:12347", "n2:12348"]


@pytest.mark.parametrize(
    ("name", "expected"), [("ring", "RING"), ("nccl", "NCCL"), ("auto", "AUTO")]
)
def test_communication_options(name: str, expected: str) -> None:
    spec = TrainSpec.from_dict({"backend": "tf", "tf": {"communication": name}})
    options = tf.communication_options(spec)
    assert options == {"implementation": expected}
