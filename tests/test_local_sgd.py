"""Local SGD's spec (`ddp.sync`): what it refuses before anything starts. Its training is held
to the local-SGD reference in tests/test_parity.py."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.spec import SpecError, TrainSpec

LOCAL = {"ddp": {"sync": {"every_steps": 4, "after": 2}}}


def issues(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return {issue.path: issue.allowed for issue in caught.value.issues}


def test_every_step_is_plain_ddp_and_more_is_local_sgd() -> None:
    assert not TrainSpec.from_dict({"backend": "ddp"}).ddp.sync.local
    sync = TrainSpec.from_dict({"backend": "ddp", **LOCAL}).ddp.sync
    assert (sync.local, sync.every_steps, sync.after) == (True, 4, 2)


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"backend": "fsdp"}, "backend fsdp"),
        ({"backend": "horovod"}, "backend horovod"),
        ({"compression": "fp16"}, "compression fp16"),
        ({"precision": "fp16"}, "precision fp16"),
    ],
)
def test_local_sgd_is_refused_where_it_cannot_run(extra: dict[str, Any], why: str) -> None:
    found = issues({"backend": "ddp", **LOCAL, **extra})
    assert why in found["ddp.sync.every_steps"]


def test_local_sgd_keeps_no_checkpoints() -> None:
    found = issues({"backend": "ddp", **LOCAL, "checkpoint": {"dir": "/tmp/ckpt"}})
    assert "one replica" in found["checkpoint.dir"]
    assert TrainSpec.from_dict({"backend": "ddp", "checkpoint": {"dir": "/tmp/ckpt"}})


def test_the_period_must_be_a_step_count() -> None:
    assert "ddp.sync.every_steps" in issues({"ddp": {"sync": {"every_steps": 0}}})
    assert "ddp.sync.after" in issues({"ddp": {"sync": {"every_steps": 2, "after": -1}}})
