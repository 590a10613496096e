"""The restart loop of `toolkit launch` (toolkit.launch.restarts), the preempted status, and
the spec rules of `launch.max_restarts` and `checkpoint.save_on_signal`. Real jobs that
restart and are preempted: tests/test_faults_survived_real.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.exit_status import SAVE_FAILED
from toolkit.launch.heartbeat import RankRecord
from toolkit.launch.outcome import PREEMPTED, LaunchResult, describe_status, exit_code
from toolkit.launch.preemption import PassOn
from toolkit.launch.restarts import CannotRestart, with_restarts
from toolkit.spec import SpecError, TrainSpec

FAILED = LaunchResult(137, failed_rank=1, failed_host="h", reason="rank 1 on host h was killed")


def attempts(*results: LaunchResult) -> tuple[list[LaunchResult], list[str], LaunchResult]:
    """Run the loop over `results` (one per start) with two restarts allowed."""
    pending, started, said = list(results), [], []

    def start(restart: int) -> LaunchResult:
        assert restart == len(started)
        started.append(pending.pop(0))
        return started[-1]

    final = with_restarts(start, 2, lambda: "step 3 (ckpt/step-000003)", said.append)
    return started, said, final


def test_a_failed_job_is_started_again_until_it_succeeds() -> None:
    started, said, final = attempts(FAILED, LaunchResult(0))
    assert final.ok and len(started) == 2
    assert said[0].startswith("toolkit launch: rank 1 on host h was killed")
    assert said[1].startswith("toolkit launch: restart 1 of 2 after ")
    assert said[1].endswith(", continuing from step 3 (ckpt/step-000003)")


def test_restarts_stop_at_max_restarts_and_return_the_last_failure() -> None:
    last = LaunchResult(1, failed_rank=0, reason="rank 0 exited with status 1")
    started, said, final = attempts(FAILED, FAILED, last)
    assert final is last and len(started) == 3
    assert [line for line in said if "restart" in line][-1].startswith(
        "toolkit launch: restart 2 of 2"
    )


def test_an_end_that_was_asked_for_is_never_restarted() -> None:
    asked = LaunchResult(124, reason="timed out after 5 s", by_request=True)
    started, said, final = attempts(asked)
    assert final is asked and len(started) == 1 and said == []


def spec(**sections: object) -> TrainSpec:
    return TrainSpec.from_dict({"backend": "ddp", **sections})


def test_restarts_need_checkpoints_to_resume_from() -> None:
    with pytest.raises(SpecError, match=r"launch\.max_restarts.*checkpoint\.dir"):
        spec(launch={"max_restarts": 2})
    with pytest.raises(SpecError, match=r"launch\.max_restarts.*resume: never"):
        spec(launch={"max_restarts": 2}, checkpoint={"dir": "ckpt", "resume": "never"})
    assert spec(launch={"max_restarts": 2}, checkpoint={"dir": "ckpt"}).launch.max_restarts == 2


def test_a_preempted_job_is_not_restarted_and_says_so() -> None:
    preempted = LaunchResult(PREEMPTED, failed_rank=0, reason="rank 0 was preempted")
    started, said, final = attempts(preempted)
    assert final.preempted and len(started) == 1 and said == []
    assert exit_code(PREEMPTED) == PREEMPTED
    assert describe_status(PREEMPTED).startswith("was preempted")


def test_a_job_whose_save_failed_is_not_restarted() -> None:
    failed = LaunchResult(SAVE_FAILED, failed_rank=1, reason="rank 1 could not save")
    started, said, final = attempts(failed)
    assert final.save_failed and len(started) == 1 and said == []
    assert exit_code(SAVE_FAILED) == SAVE_FAILED
    assert describe_status(SAVE_FAILED).startswith("could not save a checkpoint")


def test_saving_on_a_signal_needs_a_directory() -> None:
    with pytest.raises(SpecError, match=r"checkpoint\.save_on_signal.*needs checkpoint\.dir"):
        spec(checkpoint={"save_on_signal": True})
    assert spec(checkpoint={"dir": "ckpt", "save_on_signal": True}).checkpoint.preempt_s == 120


def test_a_preemption_tells_each_rank_on_this_host_once(tmp_path: Path) -> None:
    """A real child that exits 75 on SIGUSR1 stands for a rank; ranks of other hosts and
    ended ranks are not signalled."""
    handler = "import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))"
    ready = tmp_path / "ready"
    code = f"{handler}; open({str(ready)!r}, 'w').close(); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", code]) as child:
        while not ready.exists():
            time.sleep(0.01)
        here = RankRecord(rank=0, host="here", pid=child.pid, last_beat=0.0)
        elsewhere = RankRecord(rank=1, host="there", pid=os.getpid(), last_beat=0.0)
        ended = RankRecord(rank=2, host="here", pid=os.getpid(), last_beat=0.0, ended=True)
        preemption = PassOn(seconds=30)
        preemption.tell([here, elsewhere, ended], "here")
        assert child.wait(timeout=30) == PREEMPTED
        preemption.tell([here], "here")  # told already: not signalled again
        assert preemption.told == {child.pid}
        assert not preemption.expired()


def test_a_restart_that_cannot_start_ends_with_the_failure_before_it_and_says_why() -> None:
    said: list[str] = []

    def start(restart: int) -> LaunchResult:
        if restart:
            raise CannotRestart("1 rank(s) left, fewer than launch.min_np=2")
        return FAILED

    final = with_restarts(start, 2, lambda: "step 3", said.append)
    assert final is FAILED
    assert said[-1] == "toolkit launch: not restarting: 1 rank(s) left, fewer than launch.min_np=2"
