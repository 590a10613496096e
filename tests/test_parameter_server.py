"""`tf.strategy: parameter_server` before anything starts: the spec's refusals, the batch
contract (one data-parallel replica: the chief reads every batch), the job's survival rules
in the supervisor with real subprocesses, and the chief's error for an unreachable task.
The real jobs: tests/test_parameter_server_real.py."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest

from toolkit.errors import ToolkitError
from toolkit.launch import LaunchResult, run_local
from toolkit.spec import SpecError, TrainSpec

tf = pytest.importorskip("tensorflow")  # at collection: importing it sets variables

from toolkit.backends.tf.parameter_server import _training  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_orphans")

PS = {"backend": "tf", "tf": {"strategy": "parameter_server", "ps": 1}, "launch": {"np": 4}}


def issues(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return {issue.path: issue.allowed for issue in caught.value.issues}


def test_the_chief_reads_every_global_batch() -> None:
    spec = TrainSpec.from_dict({**PS, "batch": {"global": 64, "micro": 16}})
    batch = spec.batch_for()
    assert (batch.dp, batch.accumulation) == (1, 4)
    assert spec.parameter_server
    scaled = TrainSpec.from_dict({**PS, "lr_scaling": "linear", "optimizer": {"lr": 0.01}})
    assert scaled.effective_lr() == pytest.approx(0.01)  # one replica: no scaling


@pytest.mark.parametrize(
    ("extra", "path", "why"),
    [
        ({"backend": "ddp"}, "tf.strategy", "backend ddp"),
        ({"backend": "horovod", "framework": "tensorflow"}, "tf.strategy", "backend horovod"),
        ({"precision": "fp16"}, "tf.strategy", "precision fp16"),
        ({"launch": {"np": 2}}, "tf.ps", "a chief and at least one worker"),
        ({"checkpoint": {"dir": "ckpt"}}, "checkpoint.dir", "parameter_server"),
    ],
)
def test_parameter_servers_are_refused_where_they_cannot_run(
    extra: dict[str, Any], path: str, why: str
) -> None:
    assert why in issues({**PS, **extra})[path]


def _ranks(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


FAILING_RANKS = """
    import os, sys, time
    rank = int(os.environ["TOOLKIT_RANK"])
    time.sleep(0.5 * rank if rank in {failing} else 3)
    sys.exit(9 if rank in {failing} else 0)
"""


def test_a_survivable_rank_fails_and_the_job_goes_on(capfd: pytest.CaptureFixture[str]) -> None:
    roles = {0: "chief", 1: "worker 0", 2: "worker 1", 3: "ps 0"}
    survivable = {1: "a worker", 2: "a worker"}
    code = FAILING_RANKS.format(failing="{2}")
    result = run_local(_ranks(code), 4, roles=roles, survivable=survivable, timeout=60)
    assert result == LaunchResult(0)
    assert "rank 2 (worker 1) on host" in capfd.readouterr().err


def test_the_last_survivable_rank_failing_ends_the_job() -> None:
    """Nothing is left to take over the lost ranks' work: the job fails, naming the last."""
    survivable = {1: "a worker", 2: "a worker"}
    code = FAILING_RANKS.format(failing="{1, 2}")
    result = run_local(_ranks(code), 3, survivable=survivable, timeout=60)
    assert result.returncode != 0 and result.failed_rank == 2, result


def test_a_rank_that_is_not_survivable_ends_the_job_named_by_role() -> None:
    code = FAILING_RANKS.format(failing="{3}")
    roles = {0: "chief", 1: "worker 0", 2: "worker 1", 3: "ps 0"}
    result = run_local(_ranks(code), 4, roles=roles, survivable={1: "w", 2: "w"}, timeout=60)
    assert result.returncode != 0 and result.failed_rank == 3
    assert "rank 3 (ps 0) on host" in result.reason


def test_an_unreachable_parameter_server_is_one_error_naming_it() -> None:
    message = (
        "Socket closed\nAdditional GRPC error information from remote target "
        "/job:ps/replica:0/task:1/device:CPU:0 while calling RecvTensor; from "
        "/job:worker/replica:0/task:0"
    )
    expected = r"ps 1 cannot be reached while training"
    with pytest.raises(ToolkitError, match=expected) as caught, _training():
        raise tf.errors.UnavailableError(None, None, message)
    assert "worker" not in str(caught.value).split(";")[0]
    with pytest.raises(tf.errors.UnavailableError), _training():  # no task named: TF's error
        raise tf.errors.UnavailableError(None, None, "connection reset")
