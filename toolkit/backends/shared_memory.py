"""Sums, all-gathers, reduce-scatters and reduces across ranks through shared memory, for ranks
that share one host: DDP's gradient buckets (a DDP comm hook, `ddp.allreduce`), DeepSpeed's
gradient reductions and weight gathers at every ZeRO stage (its communication backend's
`all_reduce`, `reduce`, `all_gather_into_tensor` and `reduce_scatter_tensor`, `deepspeed.allreduce`;
toolkit.backends.deepspeed.shared_memory_comm), and `run.allreduce` under either.

Why: torch's Gloo moves a 25 MB bucket between two processes of one host at about 1 GB/s over
loopback TCP (20.8 ms; docs/bench/allreduce.json), and DDP's step was 1.69x the physical floor of
issue 13, most of the excess being Gloo. Through /dev/shm the same bytes take 7-8 ms
(scripts/shm_allreduce_probe.py), and the bench MLP's DDP step took 51.2 ms against native DDP's
63.3 ms over Gloo (1.35x the floor; docs/bench/step-floor.json), every parameter bit the same.

How: one segment per job in /dev/shm holds a flag per rank and two sets of `world` slots of
SLOT_BYTES each. A bucket goes through in chunks of one slot. Rank r owns the r-th 1/world share
of each chunk; for each chunk:

1. each rank writes the shares it does not own into its slot, divided by the world size for
   DDP: DDP's own hook divides each rank's gradient before summing, and dividing first keeps
   every bit of that (DeepSpeed divides, or not, before it calls all_reduce, and gets a plain
   sum); it divides its own share in place, in its bucket;
2. barrier;
3. rank r adds the others' terms of its share, in slot order, to its own, in its bucket, and
   copies the sums into its own slot;
4. barrier;
5. every rank copies the other shares' sums from their owners' slots into its bucket.

Each share is summed once, by its owner, and every rank copies those sums, so the replicas stay
bitwise equal. With 2 ranks the sums are Gloo's to the bit (a/2 + b/2 in either order); with
more, the order of the additions differs from Gloo's ring, which changes the rounding only.

A rank's own share never goes through the segment on its way in, and its sums are made in its
bucket and then copied out, not made in the segment and copied back: fewer passes over the
segment. A 25 MiB mean over 2 ranks took 0.87-1.04 (median 0.91) of the time it took when every
share went through the segment (8 launches of 57 calls each way, alternating in the same 2
processes, 2026-11-27; docs/bench/findings.md). Making the sums in the segment instead kept a
third to a half of that gain, although it moves as many bytes: here a pass over the segment
costs more than one over a bucket.
Summing the own term in with `torch.add(..., alpha=1/world)` would save the in-place division
too, but torch fuses that into one rounding (an FMA), which differs from Gloo's two on gradients
below 2**-125; the in-place division keeps the bits.

An all-gather writes each rank's chunk into its slot, passes one barrier, and every rank copies
every slot out: copies only, so every bit is the sender's. A reduce-scatter writes the same range
of each peer's share into its slot, passes one barrier, and each rank adds its peers' pieces of
its own share's range, in slot order, to its own piece, in its output: the own piece stays out
of the segment, as in the all-reduce (a 25 MiB reduce-scatter into the rank's own share, as
ZeRO-3 calls it, took 0.56-0.66 of the time it took when every piece went through the segment:
8 launches of 57 calls each way, alternating in the same 2 processes, 2026-11-27). With 2 ranks
the sums are Gloo's bits.

A reduce to one rank (the root) is half an all-reduce: every other rank writes its chunk into
its slot, one barrier, and the root adds its peers' chunks, in slot order, to its own, in its
tensor. ZeRO-1/2 reduce each rank's gradient partition so when
`zero.multi_rank_bucket_allreduce` is false: each rank then moves its peers' partitions once,
where an all-reduce of the whole bucket also copies every sum back out.

Each chunk's size and collective are written beside it, and every rank checks its peers'
after the barrier: ranks that passed tensors of different sizes, or issued their collectives
in different orders, stop with an error that says what each rank did, not with a wrong sum.

Consecutive chunks alternate between the two slot sets. A rank that writes chunk g+1 cannot
overwrite sums a slower peer is still copying from chunk g; writing into chunk g's set again
(at chunk g+2) needs chunk g+1's first barrier, which that peer reaches only after its copy,
whichever collective each chunk belongs to.

The barrier is a generation counter per rank, on its own cache line: a rank stores its count,
then waits until every count has reached it. Stores and loads are ordinary ones, which is
correct under x86-64's total store order (a peer that sees the count also sees the data written
before it); other architectures need fences Python cannot issue, so `resolve` picks Gloo there.
A peer that does not arrive within the collective timeout fails the step with an error that
names it, so a dead or stalled rank ends the job instead of hanging it.

The segment's file is unlinked as soon as every rank has mapped it: nothing is left in /dev/shm
when the job ends, however it ends.

Space: the segment is reserved whole when it is created (posix_fallocate), not just sized. A
sized-only file in a full tmpfs maps fine and then kills the first rank that touches a page
the tmpfs cannot give with SIGBUS, mid-step; a reservation fails at once, and every rank stops
with an error saying so. `auto` takes Gloo where /dev/shm has less room than the segment needs
(a container's default /dev/shm is 64 MiB: 8 ranks need 64 MiB and a little more).
"""

from __future__ import annotations

import mmap
import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.shm_layout import (
    FLAG_STRIDE,
    SHM_DIRECTORY,
    SLOT_BYTES,
    flag_bytes,
    segment_bytes,
    slots_bytes,
)
from toolkit.spec.fields import AllreduceTransport
from toolkit.units import MIB

Transport = Literal["gloo", "shared_memory"]

SPIN_SECONDS = 0.002
"""How long a waiting rank polls before it starts sleeping between polls. Ranks in step meet
within this; a rank that waits longer (a slow or stopped peer) must not hold a core."""
LONGEST_PAUSE_SECONDS = 0.001
"""Sleeps between polls double up to this: the few percent of a core a long wait costs."""

_X86_64 = ("x86_64", "amd64")
COLLECTIVES = ("sum", "all-gather", "reduce-scatter")
"""What a chunk belongs to, written beside its size (index + 1) and checked against the peers';
a reduce to rank r is written as len(COLLECTIVES) + 1 + r, so ranks that name different roots
meet an error too."""
REDUCE_PREFIX = "reduce to rank "
"""A reduce's collective is named with its root: "reduce to rank 1"."""
SEGMENT_PREFIX = "toolkit-allreduce-"
"""The segment files' names in /dev/shm, each unlinked once every rank has mapped it."""


def resolve(
    choice: AllreduceTransport,
    *,
    field: str,
    world_size: int,
    local_world_size: int,
    segment_size: int,
) -> Transport:
    """The transport a job uses: `auto` is shared memory when every rank is on this host, the
    host is x86-64 and has /dev/shm with room for `segment_size` bytes, and the job has more
    than one rank; else Gloo. An explicit
    `shared_memory` the job cannot use is an error naming the spec's `field`, not a quiet
    fall-back."""
    obstacle = _obstacle(
        world_size=world_size, local_world_size=local_world_size, segment_size=segment_size
    )
    if choice == "gloo" or (choice == "auto" and obstacle):
        return "gloo"
    if obstacle:
        raise ToolkitError(
            f"{field}: 'shared_memory' cannot run here: {obstacle}; allowed here: "
            "gloo, auto (hint: auto picks shared memory wherever it can run)"
        )
    return "shared_memory"


def open_if_chosen(
    choice: AllreduceTransport, *, field: str, env: LaunchEnvironment, timeout_s: float
) -> SharedMemoryCollectives | None:
    """The job's shared-memory collectives where `choice` resolves to them (`resolve`), else
    None: the engine's Gloo. Collective: every rank calls it at the same point."""
    world_size, local_world_size = env.world_size, env.local_world_size
    transport = resolve(
        choice,
        field=field,
        world_size=world_size,
        local_world_size=local_world_size,
        segment_size=segment_bytes(world_size),
    )
    if transport == "gloo":
        return None
    return SharedMemoryCollectives(
        rank=env.rank, world_size=world_size, timeout_s=timeout_s, field=field
    )


def _obstacle(*, world_size: int, local_world_size: int, segment_size: int) -> str | None:
    if world_size < 2:
        return "the job has one rank"
    if local_world_size != world_size:
        return f"{local_world_size} of the job's {world_size} ranks are on this host, not all"
    if platform.machine().lower() not in _X86_64:
        return f"the barrier relies on x86-64's store order and this is {platform.machine()}"
    if not os.path.isdir(SHM_DIRECTORY):
        return f"this host has no {SHM_DIRECTORY}"
    status = os.statvfs(SHM_DIRECTORY)
    free, needed = status.f_bavail * status.f_frsize, segment_size
    if free < needed:
        return (
            f"{SHM_DIRECTORY} has {free / MIB:.1f} MiB free, the segment needs {needed / MIB:.1f}"
        )
    return None


class SharedMemoryCollectives:
    """The segment and the per-chunk protocol of one job's ranks. Create it on every rank at
    the same point: the constructor is collective over the default process group. `field` is
    the spec setting that chose it, named in its errors."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, field: str) -> None:
        self.rank = rank
        self.field = field
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.generation = 0
        self.chunk = 0
        self._mapping = map_segment(rank, segment_bytes(world_size), field)
        self.flags = np.frombuffer(self._mapping, dtype=np.int64, count=FLAG_STRIDE * world_size)
        self.slots = torch.frombuffer(
            self._mapping,
            dtype=torch.uint8,
            offset=flag_bytes(world_size),
            count=slots_bytes(world_size),
        ).view(2, world_size, SLOT_BYTES)

    def mean_(self, bucket: torch.Tensor) -> torch.Tensor:
        """Replace a bucket with its mean over the ranks, DDP's way: each rank's share divided
        by the world size before the sum."""
        return self._reduce_(bucket, divide_by=self.world_size)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace a tensor with its sum over the ranks (run.allreduce's transport)."""
        return self._reduce_(tensor, divide_by=1)

    def all_gather_into_(self, output: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        """Fill `output` with every rank's `part` in rank order (torch's all_gather_into_tensor;
        ZeRO-1/2 gather their updated weights so). Copies only: every bit is the sender's. One
        barrier a chunk is enough: a rank writes a slot set again only after the next chunk's
        barrier, which each peer reaches only once it has read this one."""
        flat = part.contiguous().view(-1)
        gathered = output.view(self.world_size, flat.numel())
        per_slot = SLOT_BYTES // flat.element_size()
        for start in range(0, flat.numel(), per_slot):
            piece = flat[start : start + per_slot]
            slots = self._write_chunk(piece, "all-gather")
            gathered[:, start : start + piece.numel()].copy_(slots)
        return output

    def reduce_scatter_into_(self, output: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
        """Fill `output` with this rank's 1/world share of `whole` summed over the ranks
        (torch's reduce_scatter_tensor; ZeRO-3 reduces its gradients so). Each chunk carries the
        same range of every rank's share: a rank writes the pieces of its peers' shares into its
        slot and, after one barrier, adds its peers' pieces of its own share, in slot order, to
        its own piece. `output` may be a view of `whole` (DeepSpeed passes its own share of the
        buffer): a range of it is written only after the peers' pieces of that range have been
        copied into the slot."""
        shares = whole.contiguous().view(self.world_size, -1)
        mine = output.view(-1)
        per_slot = SLOT_BYTES // (whole.element_size() * self.world_size)
        for start in range(0, shares.shape[1], per_slot):
            piece = shares[:, start : start + per_slot]
            slots, slot_set = self._next_chunk(piece, "reduce-scatter")
            written = slots[self.rank].view(piece.shape)
            for peers in (slice(0, self.rank), slice(self.rank + 1, None)):
                written[peers].copy_(piece[peers])
            self._arrive(slot_set)
            own = mine[start : start + piece.shape[1]]
            if own.data_ptr() != piece[self.rank].data_ptr():
                own.copy_(piece[self.rank])
            every_slot = slots.view(self.world_size, self.world_size, -1)
            self._add_peers_(own, every_slot[:, self.rank])
        return output

    def reduce_to_(self, tensor: torch.Tensor, root: int) -> torch.Tensor:
        """Sum `tensor` over the ranks into rank `root`'s `tensor` (torch's reduce; ZeRO-1/2
        reduce each rank's gradient partition to its owner so under
        `zero.multi_rank_bucket_allreduce: false`); the other ranks' tensors are left as they
        were. For each chunk every other rank writes its piece into its slot and, after one
        barrier, the root adds its peers' pieces, in slot order, to its own: the root's term
        never goes through the segment, and nothing is copied back. One barrier a chunk is
        enough, as for the all-gather. With 2 ranks the sum is Gloo's bits."""
        flat = tensor.contiguous().view(-1)
        per_slot = SLOT_BYTES // flat.element_size()
        kind = f"reduce to rank {root}"
        for start in range(0, flat.numel(), per_slot):
            piece = flat[start : start + per_slot]
            slots, slot_set = self._next_chunk(piece, kind)
            if self.rank != root:
                slots[self.rank].copy_(piece)
            self._arrive(slot_set)
            if self.rank == root:
                self._add_peers_(piece, slots)
        if self.rank == root and flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))
        return tensor

    def _write_chunk(self, piece: torch.Tensor, kind: str) -> torch.Tensor:
        """Write this rank's whole piece of a chunk of the collective `kind` (the all-gather's)
        into its slot of the chunk's set, wait for every rank's, and return the set's slots
        holding them, one row per rank."""
        slots, slot_set = self._next_chunk(piece, kind)
        slots[self.rank].view(piece.shape).copy_(piece)
        self._arrive(slot_set)
        return slots

    def _next_chunk(self, piece: torch.Tensor, kind: str) -> tuple[torch.Tensor, int]:
        """The slots of the next chunk's set, one row per rank, and the set; this rank's size
        and collective for it are written beside them for its peers to check."""
        count, slot_set = piece.numel(), self.chunk % 2
        self.chunk += 1
        flags = FLAG_STRIDE * self.rank + slot_set
        self.flags[flags + 1] = count * piece.element_size()
        self.flags[flags + 3] = collective_code(kind)
        return self.slots[slot_set].view(piece.dtype)[:, :count], slot_set

    def _arrive(self, slot_set: int) -> None:
        """Wait until every rank has written its part of the chunk in `slot_set`, then check
        that they all wrote the same collective and size."""
        self._barrier()
        self._check_same_chunk(slot_set)

    def _reduce_(self, tensor: torch.Tensor, *, divide_by: int) -> torch.Tensor:
        flat = tensor.contiguous().view(-1)
        per_slot = SLOT_BYTES // flat.element_size()
        for start in range(0, flat.numel(), per_slot):
            self._reduce_chunk_(flat[start : start + per_slot], divide_by)
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))
        return tensor

    def _reduce_chunk_(self, part: torch.Tensor, divide_by: int) -> None:
        """Steps 1-5 of the module's docstring for one chunk."""
        slots, slot_set = self._next_chunk(part, "sum")
        bounds = [k * part.numel() // self.world_size for k in range(self.world_size + 1)]
        low, high = bounds[self.rank], bounds[self.rank + 1]
        mine = slots[self.rank]
        for others in (slice(0, low), slice(high, None)):
            _divide(part[others], divide_by, out=mine[others])
        own = part[low:high]
        _divide(own, divide_by, out=own)
        self._arrive(slot_set)
        self._add_peers_(own, (row[low:high] for row in slots))
        mine[low:high].copy_(own)
        self._barrier()
        for owner, row in enumerate(slots):
            if owner != self.rank:
                share = slice(bounds[owner], bounds[owner + 1])
                part[share].copy_(row[share])

    def _add_peers_(self, own: torch.Tensor, terms: Iterable[torch.Tensor]) -> None:
        """Add the peers' terms (`terms` has one per rank, in slot order) to `own`, which holds
        this rank's: the one order of additions every sum here uses, this rank's term first,
        then its peers' in slot order. With 2 ranks that is a + b either way, Gloo's bits."""
        for owner, term in enumerate(terms):
            if owner != self.rank:
                own.add_(term)

    def _barrier(self) -> None:
        self.generation += 1
        counts = self.flags[::FLAG_STRIDE]
        counts[self.rank] = self.generation
        if not wait_for(lambda: counts.min() >= self.generation, timeout_s=self.timeout_s):
            raise self._timed_out(counts)

    def _check_same_chunk(self, slot_set: int) -> None:
        """Every rank must have written a chunk of the same collective and size. One channel
        serves every collective in call order, so a rank that issued its collectives in
        another order than its peers meets a different one here: an error that says so,
        instead of a gather's bytes summed into weights. Gloo refuses tensors of different
        sizes on different ranks; so does this, instead of summing mismatched ranges. Each
        slot set has its own words: after an all-gather's one barrier a fast rank may write
        the next chunk's before a slow one has read this one's."""
        kinds = self.flags[3 + slot_set :: FLAG_STRIDE]
        if (kinds != kinds[self.rank]).any():
            called = [collective_name(int(kind)) for kind in kinds]
            raise ToolkitError(
                f"{self.field} (shared memory): the ranks called different collectives at the "
                f"same point (by rank: {called}); every rank must issue the same collectives "
                "in the same order"
            )
        written = self.flags[1 + slot_set :: FLAG_STRIDE]
        if (written != written[self.rank]).any():
            raise ToolkitError(
                f"{self.field} (shared memory): the ranks passed tensors of different sizes "
                f"(bytes of this chunk by rank: {written.tolist()}); every rank must pass a "
                "tensor of the same shape and dtype"
            )

    def _timed_out(self, counts: np.ndarray) -> ToolkitError:
        missing = [int(peer) for peer in np.flatnonzero(counts < self.generation)]
        return ToolkitError(
            f"{self.field} (shared memory): rank {self.rank} on {socket.gethostname()} waited "
            f"{self.timeout_s:g} s (timeouts.collective_s) for rank(s) {missing} on the same "
            "host; they are dead or stalled"
        )


def collective_code(kind: str) -> int:
    """The number a chunk of the collective `kind` carries in the flags (COLLECTIVES)."""
    if kind.startswith(REDUCE_PREFIX):
        return len(COLLECTIVES) + 1 + int(kind.removeprefix(REDUCE_PREFIX))
    return COLLECTIVES.index(kind) + 1


def collective_name(code: int) -> str:
    """The collective a chunk's number stands for: the inverse of `collective_code`."""
    if code > len(COLLECTIVES):
        return f"{REDUCE_PREFIX}{code - len(COLLECTIVES) - 1}"
    return COLLECTIVES[code - 1]


def wait_for(
    ready: Callable[[], bool],
    *,
    timeout_s: float,
    spin_s: float = SPIN_SECONDS,
    longest_pause_s: float = LONGEST_PAUSE_SECONDS,
) -> bool:
    """Poll `ready` until it holds (True) or `timeout_s` has passed (False): spinning for
    `spin_s`, then sleeping between polls, the sleeps doubling up to `longest_pause_s`."""
    if ready():
        return True
    start = time.monotonic()
    pause = longest_pause_s / 64
    while not ready():
        waited = time.monotonic() - start
        if waited < spin_s:
            continue
        if waited > timeout_s:
            return False
        time.sleep(pause)
        pause = min(2 * pause, longest_pause_s)
    return True


def _divide(piece: torch.Tensor, divide_by: int, *, out: torch.Tensor) -> None:
    """`piece` / `divide_by` into `out` (which may be `piece`); a plain copy when dividing by 1,
    which also serves integer tensors."""
    if divide_by == 1:
        if out.data_ptr() != piece.data_ptr():
            out.copy_(piece)
    else:
        torch.div(piece, divide_by, out=out)


def map_segment(rank: int, nbytes: int, field: str) -> mmap.mmap:
    """Rank 0 creates the segment's file, every rank maps it, rank 0 unlinks it. A rank that
    cannot open the file is not on rank 0's host, whatever its launcher said: every rank then
    fails with the same error instead of reducing with a rank that sees another segment."""
    created = ["", ""]  # the segment's path, or why rank 0 could not create it
    if rank == 0:
        created = list(create_segment(nbytes))
    dist.broadcast_object_list(created, src=0)
    path = created[0]
    if created[1]:
        raise ToolkitError(
            f"{field}: rank 0 could not reserve {nbytes / MIB:.1f} MiB of shared memory "
            f"in {SHM_DIRECTORY} ({created[1]})",
            f"free {SHM_DIRECTORY} (a container's --shm-size), or use {field}: gloo",
        )
    mapping, problem = None, ""
    try:
        with open(path, "r+b") as segment:
            mapping = mmap.mmap(segment.fileno(), nbytes)
    except OSError as error:
        problem = f"{socket.gethostname()}: {error.strerror}"
    problems: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    if rank == 0:
        os.unlink(path)
    failed = {peer: text for peer, text in enumerate(problems) if text}
    if mapping is None or failed:
        raise ToolkitError(
            f"{field}: rank(s) {sorted(failed)} could not map rank 0's shared-memory "
            f"segment {path} ({'; '.join(failed.values())}); every rank must be on one "
            f"host (hint: {field}: gloo)"
        )
    return mapping


def create_segment(nbytes: int) -> tuple[str, str]:
    """A new file of `nbytes` in /dev/shm with its pages reserved: (path, "") or, when the space
    is not there, ("", why) with nothing left behind."""
    try:
        descriptor, path = tempfile.mkstemp(prefix=SEGMENT_PREFIX, dir=SHM_DIRECTORY)
    except OSError as error:
        return "", str(error.strerror)
    try:
        os.posix_fallocate(descriptor, 0, nbytes)
    except OSError as error:
        os.unlink(path)
        return "", str(error.strerror)
    finally:
        os.close(descriptor)
    return path, ""
