"""`tf.instance_keys: per_trace` for real: 2 MultiWorker workers under `toolkit launch` train the
TF example to the same weights with one instance key per traced collective as with TensorFlow's
new key per call (which key a collective carries changes which calls meet, not what they sum).
The memory the per-call keys cost is measured, not asserted (docs/bench/findings.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.realrun import BIN, SPECS, TF_EXAMPLE, run
from toolkit.ports import free_port_range

pytestmark = pytest.mark.multiproc


def train(instance_keys: str, directory: Path) -> dict[int, str]:
    spec = yaml.safe_load((SPECS / "tf_multiworker.yaml").read_text())
    spec["tf"].update(port=free_port_range(2), instance_keys=instance_keys)
    path = directory / f"{instance_keys}.yaml"
    path.write_text(yaml.safe_dump(spec))
    launch = [str(BIN / "toolkit"), "launch", "--spec", str(path), "--"]
    done = run([*launch, TF_EXAMPLE, "--spec", str(path), "--epochs", "2", "--min-accuracy", "0.5"])
    assert done.returncode == 0, done.explain()
    assert len(done.digests) == 2 and len(set(done.digests.values())) == 1, done.explain()
    return done.digests


def test_keys_per_trace_train_to_the_weights_of_keys_per_call(tmp_path: Path) -> None:
    assert train("per_trace", tmp_path) == train("unique", tmp_path)
