"""DeepSpeed's gradient reductions and weight gathers through the toolkit's shared memory
(toolkit/backends/deepspeed/shared_memory_comm.py), and its pipeline's sends through the
mailboxes (toolkit/backends/deepspeed/send_recv_comm.py), for real: 2 ranks under the deepspeed
launcher train to the same bits as over Gloo at ZeRO stage 3 (asynchronous gathers and
reduce-scatters; `TOOLKIT_MATRIX=full` adds stage 0's all-reduces and stage 2's all-reduces with
the same gathers waited on at once; the all-reduce itself is held to Gloo's bits in
tests/test_shared_memory_allreduce.py), at ZeRO stage 2 with each gradient partition reduced
to its owner through shared memory as with DeepSpeed's all-reduce of every partition over Gloo
(`TOOLKIT_MATRIX=full` adds stage 1), and with 2 pipeline stages (sends first, through the
mailboxes). With `TOOLKIT_FAULTS=full`, a rank stopped at ZeRO stages 0, 2 and 3 is named by
the shared-memory wait within `timeouts.collective_s`, and a stopped pipeline stage by the
mailboxes' wait."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.options import FULL_FAULTS, FULL_MATRIX
from tests.realrun import BIN, SPECS, TORCH_EXAMPLE, rank_env, run
from tests.supervised import CONTRACT_SECONDS, gone, start_training_job, wait_for_ranks
from toolkit.ports import free_port

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

ON_X86_64 = os.uname().machine.lower() in ("x86_64", "amd64") and os.path.isdir("/dev/shm")
HOST = socket.gethostname()
COLLECTIVE_SECONDS = 5.0
UP_SECONDS = 240.0
STOPPED_STAGES = [0, 2, 3]
ONLY_ALL_FAULTS = (
    "TOOLKIT_FAULTS=full; by default a stopped DeepSpeed rank ends its job through the heartbeat"
    " (tests/test_stalled_engines.py, ZeRO-2 over shared memory), and the transports name a"
    " silent peer in tests/test_shared_memory_allreduce.py and tests/test_shared_memory_p2p.py"
)
SUMMED_STAGES = [0, 2, 3] if FULL_MATRIX else [3]
OWNER_STAGES = [1, 2] if FULL_MATRIX else [2]
WAIT_ENDS_THE_JOB = {"stall_s": 600, "collective_s": COLLECTIVE_SECONDS}
"""The heartbeat set far off: what ends a job with a stopped rank is a transport's wait."""


def zero_spec(stage: int, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((SPECS / "zero2.yaml").read_text())
    spec["zero"] = {"stage": stage}
    spec["launch"] = {"launcher": "deepspeed", "np": 2, "master_port": free_port()}
    spec.update(changes)
    return spec


def pipeline_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((SPECS / "pipeline.yaml").read_text())
    spec["launch"] = {"launcher": "deepspeed", "np": 2, "master_port": free_port()}
    spec.update(changes)
    return spec


def train(spec: dict[str, Any], path: Path) -> dict[int, str]:
    path.write_text(yaml.safe_dump(spec))
    argv = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port())]
    done = run(
        [*argv, TORCH_EXAMPLE, "--spec", str(path), "--epochs", "2", "--min-accuracy", "0.5"]
    )
    assert done.returncode == 0, done.explain()
    assert len(set(done.digests.values())) == 1 and len(done.digests) == 2, done.explain()
    return done.digests


def stop_one_rank(spec: dict[str, Any], stopped: int, tmp_path: Path) -> str:
    """Train under `spec` (the heartbeat set far off), SIGSTOP rank `stopped` once both ranks
    are up, and return the job's output: the job must have failed within the collective timeout
    and left no rank behind."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    job, piddir, log = start_training_job(path, tmp_path, rank_env())
    try:
        ranks = wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
        os.kill(ranks[stopped], signal.SIGSTOP)
        returncode = job.wait(timeout=COLLECTIVE_SECONDS + CONTRACT_SECONDS)
    finally:
        job.kill()
        job.wait()
    output = log.read_text()
    assert returncode not in (0, 124), output[-3000:]
    assert gone(ranks[0]) and gone(ranks[1])
    return output


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
@pytest.mark.parametrize("stage", SUMMED_STAGES)
def test_zero_sums_through_shared_memory_to_the_bits_of_gloo(stage: int, tmp_path: Path) -> None:
    """Both transports add a + b for 2 ranks: every weight is the same, not just close."""
    through_gloo = train(zero_spec(stage, deepspeed={"allreduce": "gloo"}), tmp_path / "g.yaml")
    through_shm = train(
        zero_spec(stage, deepspeed={"allreduce": "shared_memory"}), tmp_path / "s.yaml"
    )
    assert through_shm == through_gloo


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
@pytest.mark.parametrize("stage", OWNER_STAGES)
def test_zero_reduces_to_owners_through_shared_memory_to_the_bits_of_deepspeeds_all_reduce(
    stage: int, tmp_path: Path
) -> None:
    """The spec's default (`zero.multi_rank_bucket_allreduce: false`: each gradient partition
    reduced to its owner, through shared memory) against DeepSpeed's own (every partition
    all-reduced, over Gloo): the owner's sum is a + b either way, so every weight is the same."""
    deepspeeds_own = zero_spec(stage, deepspeed={"allreduce": "gloo"})
    deepspeeds_own["zero"]["multi_rank_bucket_allreduce"] = True
    through_gloo = train(deepspeeds_own, tmp_path / "g.yaml")
    to_owners = train(
        zero_spec(stage, deepspeed={"allreduce": "shared_memory"}), tmp_path / "s.yaml"
    )
    assert to_owners == through_gloo


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
@pytest.mark.skipif(not FULL_FAULTS, reason=ONLY_ALL_FAULTS)
@pytest.mark.parametrize("stage", STOPPED_STAGES)
def test_a_stopped_rank_is_named_by_the_shared_memory_wait(stage: int, tmp_path: Path) -> None:
    """The heartbeat is set far off, so what ends the job is rank 0's wait in a gradient
    reduction or weight gather: that it names rank 1 shows they go through shared memory."""
    spec = zero_spec(
        stage,
        deepspeed={"allreduce": "shared_memory"},
        timeouts=WAIT_ENDS_THE_JOB,
    )
    output = stop_one_rank(spec, 1, tmp_path)
    expected = (
        f"deepspeed.allreduce (shared memory): rank 0 on {HOST} waited {COLLECTIVE_SECONDS:g} s "
        "(timeouts.collective_s) for rank(s) [1]"
    )
    assert expected in output, output[-3000:]


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
def test_pipeline_sends_through_mailboxes_to_the_bits_of_gloo(tmp_path: Path) -> None:
    """The same bytes arrive in the same order either way, and sending first changes when a
    send happens, not what is computed: every weight is the same."""
    through_gloo = train(pipeline_spec(deepspeed={"send_recv": "gloo"}), tmp_path / "g.yaml")
    through_mailboxes = train(
        pipeline_spec(deepspeed={"send_recv": "shared_memory"}), tmp_path / "s.yaml"
    )
    assert through_mailboxes == through_gloo


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
@pytest.mark.skipif(not FULL_FAULTS, reason=ONLY_ALL_FAULTS)
def test_a_stopped_pipeline_stage_is_named_by_the_mailbox_wait(tmp_path: Path) -> None:
    """Every wait of one stage on the other goes through a mailbox with 2 stages, the loss's
    broadcast after each step included (over Gloo it had caught the stopped stage's neighbour
    in half the runs of this test): stopping stage 0 ends the job with the mailbox's error
    naming it, within the collective timeout."""
    spec = pipeline_spec(
        deepspeed={"send_recv": "shared_memory"},
        timeouts=WAIT_ENDS_THE_JOB,
    )
    output = stop_one_rank(spec, 0, tmp_path)
    expected = (
        f"deepspeed.send_recv (shared memory): rank 1 on {HOST} waited {COLLECTIVE_SECONDS:g} s "
        "(timeouts.collective_s) for rank 0 on the same host"
    )
    assert expected in output, output[-3000:]
