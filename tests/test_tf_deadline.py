"""The collective timeout of MultiWorkerMirroredStrategy (toolkit/backends/tf/deadline.py): the
watchdog's logic alone, then for real: 2 workers under `toolkit launch`, whose threads must not
grow while they train (TensorFlow's own per-collective timeout started a sleeping thread for
every collective), and whose job a stopped worker must end within the collective timeout, named
by its peer's overrun, with the heartbeat set far off."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.realrun import SPECS, rank_env
from tests.supervised import CONTRACT_SECONDS, gone, start_training_job, wait_for_ranks
from toolkit.backends.tf.deadline import CallDeadline
from toolkit.ports import free_port_range

HOST = socket.gethostname()
COLLECTIVE_SECONDS = 5.0
UP_SECONDS = 240.0
"""TensorFlow starts slowly on a busy 2-core machine."""
TRAINING_WINDOW_SECONDS = 10.0
THREAD_GROWTH_BOUND = 40
"""Threads a training rank may gain over the window (TensorFlow's pools settle in the first
steps). With TensorFlow's per-collective timeout a rank of this model gained hundreds."""


def test_a_call_that_overruns_aborts_once_with_a_message_naming_it() -> None:
    messages: list[str] = []
    aborted = threading.Event()

    def abort(message: str) -> None:
        messages.append(message)
        aborted.set()

    deadline = CallDeadline(0.2, "rank 1 on host-a", abort)
    with deadline.bounded("a training step"):
        assert aborted.wait(timeout=CONTRACT_SECONDS)
    deadline.close()
    assert messages == [
        "tf (MultiWorkerMirroredStrategy): a training step on rank 1 on host-a ran longer than "
        "0.2 s (timeouts.collective_s) waiting for its peers; one of them is dead or stalled, or "
        "the call computes for longer than that (then raise timeouts.collective_s)"
    ]


def test_calls_that_end_in_time_and_time_between_calls_abort_nothing() -> None:
    messages: list[str] = []
    deadline = CallDeadline(0.5, "rank 0 on host-a", messages.append)
    for _ in range(3):
        with deadline.bounded("a training step"):
            pass
    time.sleep(1.0)  # idle past the timeout: no call is running
    deadline.close()
    assert messages == []


def test_a_call_inside_another_is_timed_as_part_of_it() -> None:
    messages: list[str] = []
    aborted = threading.Event()
    deadline = CallDeadline(0.3, "rank 0 on host-a", lambda m: (messages.append(m), aborted.set()))
    with deadline.bounded("a save"):
        with deadline.bounded("an all-reduce (sum)"):
            pass  # ending the inner call must not stop the outer one's clock
        assert aborted.wait(timeout=CONTRACT_SECONDS)
    deadline.close()
    assert len(messages) == 1 and messages[0].startswith("tf (MultiWorkerMirroredStrategy): a save")


def multiworker_spec(directory: Path) -> Path:
    spec = yaml.safe_load((SPECS / "tf_multiworker.yaml").read_text())
    spec["tf"]["port"] = free_port_range(2)
    spec["timeouts"] = {"stall_s": 600, "collective_s": COLLECTIVE_SECONDS}
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.multiproc
@pytest.mark.usefixtures("no_orphans")
def test_a_multiworker_job_keeps_its_threads_and_a_stopped_worker_ends_it(tmp_path: Path) -> None:
    job, piddir, log = start_training_job(multiworker_spec(tmp_path), tmp_path, rank_env())
    try:
        ranks = wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
        worker = psutil.Process(ranks[0])
        threads_before = worker.num_threads()
        time.sleep(TRAINING_WINDOW_SECONDS)
        threads_after = worker.num_threads()
        os.kill(ranks[1], signal.SIGSTOP)
        returncode = job.wait(timeout=COLLECTIVE_SECONDS + CONTRACT_SECONDS)
    finally:
        job.kill()
        job.wait()
    output = log.read_text()
    assert threads_after - threads_before < THREAD_GROWTH_BOUND, (threads_before, threads_after)
    assert returncode not in (0, 124), output[-3000:]
    expected = (
        f"on rank 0 on {HOST} ran longer than {COLLECTIVE_SECONDS:g} s (timeouts.collective_s)"
    )
    assert expected in output, output[-3000:]
    assert gone(ranks[0]) and gone(ranks[1])
