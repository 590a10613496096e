"""The pipeline's sends-first schedule (toolkit/backends/deepspeed/send_recv_comm.py), pure
logic over DeepSpeed's own TrainSchedule: the same instructions, each step's sends moved to its
front; and when the mailboxes let a step use it."""

from __future__ import annotations

import pytest
from deepspeed.runtime.pipe import schedule

from toolkit.backends.deepspeed.send_recv_comm import (
    SendsFirst,
    TrainSchedules,
    neighbour_pairs,
    sends_cannot_wait,
)
from toolkit.shm_layout import MAILBOX_RING_BYTES

SENDS = (schedule.SendActivation, schedule.SendGrad)


def _steps(schedule_or_wrapper: object) -> list[list[str]]:
    return [[repr(command) for command in step] for step in schedule_or_wrapper]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (2, 4), (2, 8), (4, 8)])
def test_each_step_sends_first_and_keeps_every_instruction(stages: int, micro_batches: int) -> None:
    for stage in range(stages):
        deepspeeds = schedule.TrainSchedule(
            micro_batches=micro_batches, stages=stages, stage_id=stage
        )
        ours = SendsFirst(
            schedule.TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage)
        )
        assert ours.num_pipe_buffers() == deepspeeds.num_pipe_buffers()
        for theirs, mine in zip(_steps(deepspeeds), _steps(ours), strict=True):
            assert sorted(theirs) == sorted(mine)
            sends = [c for c in theirs if c.startswith(("SendActivation", "SendGrad"))]
            assert mine[: len(sends)] == sends
            assert mine[len(sends) :] == [c for c in theirs if c not in sends]


def test_the_first_stage_sends_its_activation_before_it_waits_for_a_gradient() -> None:
    """DeepSpeed's order, RecvGrad then SendActivation, is what the reordering is for."""
    deepspeeds = _steps(schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0))
    ours = _steps(SendsFirst(schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0)))
    step = next(
        i
        for i, s in enumerate(deepspeeds)
        if s[:2] == ["RecvGrad(buffer_id=0)", "SendActivation(buffer_id=1)"]
    )
    assert ours[step][:2] == ["SendActivation(buffer_id=1)", "RecvGrad(buffer_id=0)"]


@pytest.mark.parametrize(
    ("burst", "dynamic_shape", "expected"),
    [
        (0, False, False),  # nothing sent yet: the first step runs in DeepSpeed's order
        (MAILBOX_RING_BYTES // 2, False, True),
        (MAILBOX_RING_BYTES // 2 + 64, False, False),  # two would not fit in a ring
        (4096, True, False),  # shapes that change: a later send may not fit
    ],
)
def test_sends_go_first_only_where_they_cannot_wait_for_room(
    burst: int, dynamic_shape: bool, expected: bool
) -> None:
    assert sends_cannot_wait(burst, dynamic_shape) is expected


def test_neighbours_send_both_ways() -> None:
    assert neighbour_pairs([[0, 1], [1, 0]]) == [(0, 1), (1, 0)]
    assert neighbour_pairs([[0, 2], [1, 3], [2, 0], [3, 1]]) == [(0, 2), (1, 3), (2, 0), (3, 1)]
    assert neighbour_pairs([[0, 1], [1, 2], [2, 0]]) == [
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 2),
        (2, 0),
        (2, 1),
    ]
    assert neighbour_pairs([[0, 0]]) == []


class _Counts:
    """What TrainSchedules reads of the mailboxes and the engine."""

    def __init__(self) -> None:
        self.largest_burst = 0
        self.dynamic_shape = False


def test_the_first_step_measures_and_every_later_one_sends_first() -> None:
    counts = _Counts()
    schedules = TrainSchedules(
        lambda: schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0),
        counts,  # type: ignore[arg-type]
        counts,
    )
    assert isinstance(schedules(), schedule.TrainSchedule)  # nothing measured yet
    counts.largest_burst = 600 << 10  # one 600 KiB activation a send
    assert isinstance(schedules(), SendsFirst)
    counts.largest_burst = 1200 << 10  # two of them once sending first: decided already
    assert isinstance(schedules(), SendsFirst)


def test_bursts_too_large_for_two_in_a_ring_keep_deepspeeds_order() -> None:
    counts = _Counts()
    counts.largest_burst = MAILBOX_RING_BYTES
    schedules = TrainSchedules(
        lambda: schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0),
        counts,  # type: ignore[arg-type]
        counts,
    )
    assert all(isinstance(schedules(), schedule.TrainSchedule) for _ in range(3))
