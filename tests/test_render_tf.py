"""TF_CONFIG per rank (MultiWorkerMirroredStrategy and parameter servers) and
MultiWorkerMirroredStrategy communication options."""

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


def test_parameter_server_roles_by_rank() -> None:
    """Rank 0 the chief, the last tf.ps ranks the parameter servers, the workers between."""
    spec = TrainSpec.from_dict(
        {
            "backend": "tf",
            "launch": {"np": 5},
            "tf": {"strategy": "parameter_server", "ps": 2, "port": 20000},
        }
    )
    configs = [json.loads(text) for text in tf.tf_configs(spec)]
    address = [f"localhost:{20000 + rank}" for rank in range(5)]
    cluster = {"chief": address[:1], "worker": address[1:3], "ps": address[3:]}
    assert [c["cluster"] for c in configs] == [cluster] * 5
    tasks = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)]
    assert [(c["task"]["type"], c["task"]["index"]) for c in configs] == tasks
    assert json.loads(tf.tf_config(spec, 3)) == configs[3]
    assert tf.rank_roles(spec) == {0: "chief", 1: "worker 0", 2: "worker 1", 3: "ps 0", 4: "ps 1"}
    assert sorted(tf.survivable_ranks(spec)) == [1, 2]


def test_mirrored_ranks_have_no_roles() -> None:
    spec = TrainSpec.from_dict({"backend": "tf", "launch": {"np": 3}})
    assert tf.rank_roles(spec) == {} and tf.survivable_ranks(spec) == {}


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
