"""The pipeline engine hands activations and their gradients between stages through the
toolkit's shared-memory mailboxes (toolkit.backends.shared_memory_p2p) when every rank is on
one host (`deepspeed.send_recv`).

Where DeepSpeed sends: deepspeed/runtime/pipe/p2p.py sends and receives with blocking
`dist.send`/`dist.recv` (it refuses `async_op`), which reach `deepspeed.comm.comm.cdb.send` and
`.recv`; so do `send_obj`/`recv_obj` and the tensor metadata the engine sends before its first
hand-off. Over Gloo a send returns once the neighbour has received it, so every hand-off is a
rendezvous (docs/bench/findings.md, the pipeline bubble). The wrapper here sends through a
mailbox per direction between the ranks DeepSpeed's grid pairs for sending (`grid.p2p_groups`:
each stage's rank and the next stage's, the last wrapping to the first): a send returns once its
bytes are in the mailbox. Messages between two ranks keep their order, as over Gloo, and the
bytes are the sender's, so the weights are the same bits either way (tests/
test_deepspeed_shared_memory.py). A send or receive with a group or tag of its own, or between
ranks without a mailbox, is DeepSpeed's backend's. The loss broadcast after each step goes
through the mailboxes too where the root has one to every rank of the group (2 stages).

Sends first. DeepSpeed's 1F1B TrainSchedule defers each stage's send of an activation to the
start of its next (backward) step, after that step's receive of a gradient: with blocking sends
both neighbours sending at once would wait for each other forever. That order puts a round trip
on the pipeline's critical path every micro-batch: the last stage, done with micro-batch k's
backward pass, sends its gradient and waits for micro-batch k+1's activation, which the stage
before sends only once it has received that gradient, although it computed the activation a
pass earlier. With sends that return at once there is no such deadlock, so the toolkit runs the
schedule's steps with their sends first (`SendsFirst`): an activation leaves as soon as it is
computed. Measured on the bench pipeline (2 stages, 4 and 8 micro-batches, `toolkit bench
bubble`): the median hand-off was 0.8-0.9 ms through the mailboxes in DeepSpeed's order and
0.5-0.7 ms sending first, in runs side by side; 0.9-1.4 ms over Gloo (docs/bench/findings.md).

A send returns at once only while the ring has room for it. The first step runs in DeepSpeed's
order and measures the most bytes one send instruction puts in flight to a neighbour
(`SharedMemoryMailboxes.largest_burst`, the tensor shapes DeepSpeed sends first included).
The later steps send first only if two such bursts fit in a ring and the model's shapes are
static (DeepSpeed sends the same tensors every step then): sending first, a stage has sent at
most one activation beyond the one its neighbour is working on when it waits for a gradient.
Were a send to wait for room all the same, the job would end with the mailbox's timeout error
naming the peer, not hang.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from deepspeed.comm import comm as deepspeed_comm
from deepspeed.runtime.pipe import schedule

from toolkit.backends.deepspeed.shared_memory_comm import CommWrapper
from toolkit.backends.shared_memory_p2p import SharedMemoryMailboxes
from toolkit.shm_layout import MAILBOX_RING_BYTES

FIELD = "deepspeed.send_recv"


class MailboxComm(CommWrapper):
    """DeepSpeed's communication backend with `send` and `recv` through the mailboxes, and
    `broadcast` where its root has a mailbox to every other rank of the group: the loss the
    last stage broadcasts to its pipeline after every step, which over Gloo is one more
    rendezvous a step (and, with 2 stages, the one wait of a stage on its neighbour that would
    otherwise not go through a mailbox)."""

    def __init__(self, inner: Any, mailboxes: SharedMemoryMailboxes) -> None:
        self.inner = inner
        self.mailboxes = mailboxes

    def send(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> Any:
        if not self._through_mailbox(self.mailboxes.rank, dst, tensor, group, tag):
            return self.inner.send(tensor=tensor, dst=dst, group=group, tag=tag)
        self.mailboxes.send(tensor, dst)
        return None

    def recv(
        self, tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0
    ) -> Any:
        """torch.distributed.recv's return: the sender's rank."""
        if src is None or not self._through_mailbox(src, self.mailboxes.rank, tensor, group, tag):
            return self.inner.recv(tensor=tensor, src=src, group=group, tag=tag)
        self.mailboxes.recv(tensor, src)
        return src

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        members = (
            list(range(dist.get_world_size()))
            if group is None
            else dist.get_process_group_ranks(group)
        )
        others = [rank for rank in members if rank != src]
        rank = self.mailboxes.rank
        if async_op or tensor.is_cuda or not all(self.mailboxes.connects(src, o) for o in others):
            return self.inner.broadcast(tensor=tensor, src=src, group=group, async_op=async_op)
        if rank == src:
            for receiver in others:
                self.mailboxes.send(tensor, receiver)
        elif rank in others:
            self.mailboxes.recv(tensor, src)
        return None

    def _through_mailbox(
        self, sender: int, receiver: int, tensor: torch.Tensor, group: Any, tag: int
    ) -> bool:
        return (
            group is None
            and tag == 0
            and not tensor.is_cuda
            and self.mailboxes.connects(sender, receiver)
        )


def neighbour_pairs(p2p_groups: list[list[int]]) -> list[tuple[int, int]]:
    """The ordered (sender, receiver) pairs of DeepSpeed's grid: each of its [rank, next stage's
    rank] pairs both ways, since activations go forward and their gradients back."""
    pairs = {(first, second) for first, second in p2p_groups if first != second}
    return sorted(pairs | {(second, first) for first, second in pairs})


class SendsFirst:
    """A pipeline schedule's steps with each step's sends before its other instructions, in
    their own order otherwise (the module's docs). What DeepSpeed's `_exec_schedule` reads of a
    schedule: its steps, and how many buffers it needs."""

    SENDS = (schedule.SendActivation, schedule.SendGrad)

    def __init__(self, inner: schedule.PipeSchedule) -> None:
        self.inner = inner

    def num_pipe_buffers(self) -> int:
        buffers: int = self.inner.num_pipe_buffers()
        return buffers

    def __iter__(self) -> Iterator[list[schedule.PipeInstruction]]:
        for step in self.inner:
            sends = [command for command in step if isinstance(command, self.SENDS)]
            yield sends + [command for command in step if not isinstance(command, self.SENDS)]


def sends_cannot_wait(burst: int, dynamic_shape: bool) -> bool:
    """Whether, with sends first, every send will find room in its ring (the module's docs):
    two of the largest bursts the first step put in flight fit in one, and later steps send the
    same tensors."""
    return not dynamic_shape and 0 < 2 * burst <= MAILBOX_RING_BYTES


class TrainSchedules:
    """The engine's `_train_schedule` (what `train_batch` calls for each step's schedule): the
    first step in DeepSpeed's order, which measures the bursts; every later one with its sends
    first where `sends_cannot_wait` (decided once, since sending first makes a burst of two
    sends out of one)."""

    def __init__(
        self, deepspeeds: Callable[[], Any], mailboxes: SharedMemoryMailboxes, engine: Any
    ):
        self.deepspeeds = deepspeeds
        self.mailboxes = mailboxes
        self.engine = engine
        self.sends_first: bool | None = None

    def __call__(self) -> Any:
        steps = self.deepspeeds()
        if self.sends_first is None and self.mailboxes.largest_burst:
            self.sends_first = sends_cannot_wait(
                self.mailboxes.largest_burst, self.engine.dynamic_shape
            )
        return SendsFirst(steps) if self.sends_first else steps


def install(mailboxes: SharedMemoryMailboxes, engine: Any) -> None:
    """Put the wrapper in front of DeepSpeed's backend once the pipeline engine is built, and
    let the engine's training steps send first (`TrainSchedules`): on this engine instance only.
    toolkit.backends.deepspeed.shared_memory_comm.uninstall takes the wrapper away."""
    deepspeed_comm.cdb = MailboxComm(deepspeed_comm.cdb, mailboxes)
    engine._train_schedule = TrainSchedules(engine._train_schedule, mailboxes, engine)
