"""The shared-memory collectives (toolkit/backends/shared_memory.py) of DDP and DeepSpeed: which
transport a job gets, and the sums, gathers and reduce-scatters themselves in real processes
against Gloo's, chunk boundaries and dtypes included; a peer that never arrives is a named error
within the timeout; /dev/shm is left as it was found."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from toolkit.backends import shared_memory
from toolkit.backends.ddp.comm_hook import comm_hook
from toolkit.backends.shared_memory import SEGMENT_PREFIX, SharedMemoryCollectives, resolve
from toolkit.errors import ToolkitError
from toolkit.ports import free_port
from toolkit.shm_layout import SLOT_BYTES, segment_bytes

FIELD = "ddp.allreduce"
ON_X86_64 = platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir("/dev/shm")


@pytest.mark.parametrize(
    ("choice", "world", "local", "expected"),
    [
        ("auto", 2, 2, "shared_memory"),
        ("auto", 4, 2, "gloo"),
        ("auto", 1, 1, "gloo"),
        ("gloo", 2, 2, "gloo"),
        ("shared_memory", 3, 3, "shared_memory"),
    ],
)
def test_which_transport_a_job_gets(
    monkeypatch: pytest.MonkeyPatch, choice: str, world: int, local: int, expected: str
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(os.path, "isdir", lambda path: path == "/dev/shm")
    assert (
        resolve(
            choice,
            field=FIELD,
            world_size=world,
            local_world_size=local,
            segment_size=segment_bytes(world),
        )
        == expected
    )  # type: ignore[arg-type]


def test_auto_keeps_gloo_where_the_barrier_would_be_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert (
        resolve(
            "auto", field=FIELD, world_size=2, local_world_size=2, segment_size=segment_bytes(2)
        )
        == "gloo"
    )


@pytest.mark.parametrize(
    ("world", "local", "machine", "reason"),
    [
        (4, 2, "x86_64", "2 of the job's 4 ranks are on this host"),
        (2, 2, "aarch64", "this is aarch64"),
        (1, 1, "x86_64", "the job has one rank"),
    ],
)
def test_shared_memory_written_where_it_cannot_run_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, world: int, local: int, machine: str, reason: str
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    with pytest.raises(ToolkitError) as caught:
        resolve(
            "shared_memory",
            field=FIELD,
            world_size=world,
            local_world_size=local,
            segment_size=segment_bytes(world),
        )
    message = str(caught.value)
    assert message.startswith("ddp.allreduce: 'shared_memory' cannot run here")
    assert reason in message and "allowed here: gloo, auto" in message and "\n" not in message


def test_auto_keeps_gloo_where_dev_shm_has_no_room_for_the_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 ranks need 64 MiB and two cache lines a rank; a container's default /dev/shm is 64 MiB."""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    room = os.statvfs_result((4096, 4096, 16384, 16384, 16384, 0, 0, 0, 0, 255))  # 64 MiB free
    monkeypatch.setattr(os, "statvfs", lambda path: room)
    assert (
        resolve(
            "auto", field=FIELD, world_size=4, local_world_size=4, segment_size=segment_bytes(4)
        )
        == "shared_memory"
    )
    assert (
        resolve(
            "auto", field=FIELD, world_size=8, local_world_size=8, segment_size=segment_bytes(8)
        )
        == "gloo"
    )
    with pytest.raises(ToolkitError, match=r"has 64\.0 MiB free, the segment needs 64\.0"):
        resolve(
            "shared_memory",
            field=FIELD,
            world_size=8,
            local_world_size=8,
            segment_size=segment_bytes(8),
        )


@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
def test_a_segment_is_reserved_whole_or_not_created() -> None:
    """Reserved, not just sized: a tmpfs that cannot hold it fails here, not with SIGBUS when a
    rank first touches a page in the middle of a step."""
    before = _segments()
    path, problem = shared_memory.create_segment(1 << 20)
    try:
        assert problem == ""
        assert os.stat(path).st_blocks * 512 >= 1 << 20  # the pages are allocated
    finally:
        os.unlink(path)
    path, problem = shared_memory.create_segment(1 << 50)  # a PiB: more than any /dev/shm
    assert (path, problem) == ("", "No space left on device")
    assert _segments() == before, "a segment was left in /dev/shm"


def _join(rank: int, world: int, port: int) -> None:
    """A spawned worker's Gloo process group, which the segment's set-up goes through."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


SIZES = (1, 7, SLOT_BYTES // 4 - 1, SLOT_BYTES // 4 + 13, 3 * SLOT_BYTES // 4 + 5)
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _generator(rank: int, size: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * rank + size)


def _values(rank: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Each rank's own values of one case."""
    return torch.randn(size, generator=_generator(rank, size), dtype=torch.float64).to(dtype)


def _compare_with_gloo(rank: int, world: int, port: int, results: Path) -> None:
    _join(rank, world, port)
    transport = SharedMemoryCollectives(rank=rank, world_size=world, timeout_s=60, field=FIELD)
    lines = []
    for dtype in DTYPES:
        for size in SIZES:
            mine = _values(rank, size, dtype)
            reference = mine / world  # DDP's own hook: divide, then sum through Gloo
            dist.all_reduce(reference)
            ours = transport.mean_(mine.clone())
            gathered = [torch.empty_like(ours) for _ in range(world)]
            dist.all_gather(gathered, ours)
            same_on_every_rank = all(torch.equal(gathered[0], other) for other in gathered)
            bitwise = torch.equal(ours, reference)
            # Another order of additions: a few roundings of values of order 1 apart
            eps = torch.finfo(dtype).eps
            close = torch.allclose(ours.double(), reference.double(), rtol=8 * eps, atol=8 * eps)
            # ZeRO-1/2's weight gather: copies, so Gloo's bits for any number of ranks
            gloo_gather = torch.empty(world * size, dtype=dtype)
            dist.all_gather_into_tensor(gloo_gather, mine)
            our_gather = torch.full((world * size,), float("nan"), dtype=dtype)
            transport.all_gather_into_(our_gather, mine)
            gathers = torch.equal(our_gather, gloo_gather)
            scatters = _reduce_scatters_as_gloo(transport, rank, world, size, dtype)
            reduces = _reduces_as_gloo(transport, rank, world, size, dtype)
            # run.allreduce's plain sum, of integers too: exact in any order, so Gloo's
            counts = torch.randint(-(2**40), 2**40, (size,), generator=_generator(rank, size))
            gloo_counts = counts.clone()
            dist.all_reduce(gloo_counts)
            sums = torch.equal(transport.sum_(counts), gloo_counts)
            lines.append(
                f"{dtype} {size} {same_on_every_rank} {bitwise} {close} {gathers} {scatters} "
                f"{reduces} {sums}"
            )
    (results / f"rank{rank}.txt").write_text("\n".join(lines))
    dist.destroy_process_group()


def _reduce_scatters_as_gloo(
    transport: SharedMemoryCollectives, rank: int, world: int, size: int, dtype: torch.dtype
) -> str:
    """ZeRO-3's gradient reduce-scatter, into a fresh tensor and, as DeepSpeed calls it, into
    this rank's share of the input itself: `bits` (Gloo's exactly), `close` (another order of
    additions), or what went wrong."""
    whole = _values(rank, world * size, dtype)
    reference = torch.empty(size, dtype=dtype)
    dist.reduce_scatter_tensor(reference, whole.clone())
    ours = torch.full((size,), float("nan"), dtype=dtype)
    transport.reduce_scatter_into_(ours, whole)
    in_place = whole.clone()
    transport.reduce_scatter_into_(in_place.view(world, size)[rank], in_place)
    if not torch.equal(in_place.view(world, size)[rank], ours):
        return "in-place-differs"
    if torch.equal(ours, reference):
        return "bits"
    eps = torch.finfo(dtype).eps
    close = torch.allclose(ours.double(), reference.double(), rtol=8 * eps, atol=8 * eps)
    return "close" if close else "differs"


def _reduces_as_gloo(
    transport: SharedMemoryCollectives, rank: int, world: int, size: int, dtype: torch.dtype
) -> str:
    """ZeRO-1/2's reduce of each partition to its owner, to every root in turn: `bits` (Gloo's
    sum on the root exactly, the others' tensors untouched), `close` (another order of
    additions), or what went wrong."""
    verdicts = []
    for root in range(world):
        mine = _values(rank, size + root, dtype)
        reference = mine.clone()
        dist.reduce(reference, dst=root)
        ours = transport.reduce_to_(mine.clone(), root)
        if rank != root:
            verdicts.append("bits" if torch.equal(ours, mine) else "peer-changed")
        elif torch.equal(ours, reference):
            verdicts.append("bits")
        else:
            eps = torch.finfo(dtype).eps
            close = torch.allclose(ours.double(), reference.double(), rtol=8 * eps, atol=8 * eps)
            verdicts.append("close" if close else "differs")
    worst = [v for v in verdicts if v != "bits"]
    return worst[0] if worst else "bits"


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)}


@pytest.mark.multiproc
@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
@pytest.mark.parametrize("world", [2, 3])
def test_sums_gathers_and_scatters_match_gloo_and_every_rank_reads_the_same(
    world: int, tmp_path: Path
) -> None:
    before = _segments()
    mp.spawn(_compare_with_gloo, args=(world, free_port(), tmp_path), nprocs=world)
    for rank in range(world):
        rows = [line.split() for line in (tmp_path / f"rank{rank}.txt").read_text().splitlines()]
        assert len(rows) == len(SIZES) * len(DTYPES)
        for dtype, size, same, bitwise, close, gathers, scatters, reduces, sums in rows:
            assert gathers == "True", f"not Gloo's gather: {dtype} x {size}"
            # ZeRO-1/2's reduce to each owner: as the reduce-scatter
            assert reduces == "bits" or (world > 2 and reduces == "close"), (dtype, size)
            assert sums == "True", f"not Gloo's integer sum: {size}"
            # ZeRO-3's reduce-scatter: Gloo's bits for 2 ranks, its sums to rounding for more
            assert scatters == "bits" or (world > 2 and scatters == "close"), (dtype, size)
            assert same == "True", f"ranks disagree: {dtype} x {size}"
            assert close == "True", f"not Gloo's sum: {dtype} x {size}"
            # 2 ranks: a/2 + b/2 is the same in either order, so Gloo's bits exactly
            assert world != 2 or bitwise == "True", f"not Gloo's bits: {dtype} x {size}"
    assert _segments() == before, "a segment was left in /dev/shm"


def _wait_for_absent_peer(rank: int, port: int, results: Path) -> None:
    _join(rank, 2, port)
    transport = SharedMemoryCollectives(rank=rank, world_size=2, timeout_s=3, field=FIELD)
    if rank == 0:
        start = time.monotonic()
        try:
            transport.mean_(torch.ones(10))
        except ToolkitError as error:
            (results / "error.txt").write_text(f"{time.monotonic() - start:.2f}\n{error}")
    else:
        time.sleep(6)  # alive, never arrives: a stalled peer


@pytest.mark.multiproc
@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
def test_a_peer_that_never_arrives_is_named_within_the_timeout(tmp_path: Path) -> None:
    mp.spawn(_wait_for_absent_peer, args=(free_port(), tmp_path), nprocs=2)
    waited, message = (tmp_path / "error.txt").read_text().split("\n", 1)
    assert 3 <= float(waited) < 3 + 5, waited  # the timeout, with a generous contract bound
    assert "rank(s) [1]" in message and "timeouts.collective_s" in message
    assert "\n" not in message


def test_the_hook_is_the_signature_ddp_accepts() -> None:
    """DDP rejects a hook whose annotations are strings (a module with postponed annotations)."""
    annotations = comm_hook.__annotations__
    assert annotations["bucket"] is dist.GradBucket
    assert annotations["return"] == torch.futures.Future[torch.Tensor]


def _map_from_another_host(rank: int, port: int, results: Path) -> None:
    _join(rank, 2, port)
    if rank == 1:  # as a rank on another host sees rank 0's path: no such file there

        def elsewhere(path: str, mode: str) -> None:
            raise FileNotFoundError(2, "No such file or directory", path)

        shared_memory.open = elsewhere  # type: ignore[attr-defined]
    try:
        SharedMemoryCollectives(rank=rank, world_size=2, timeout_s=10, field=FIELD)
    except ToolkitError as error:
        (results / f"rank{rank}.txt").write_text(str(error))
    dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
def test_a_rank_that_cannot_see_the_segment_fails_every_rank_clearly(tmp_path: Path) -> None:
    before = _segments()
    mp.spawn(_map_from_another_host, args=(free_port(), tmp_path), nprocs=2)
    for rank in (0, 1):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert message.startswith("ddp.allreduce: rank(s) [1] could not map"), message
        assert "No such file or directory" in message and "ddp.allreduce: gloo" in message
    assert _segments() == before, "a segment was left in /dev/shm"


def _sums_of_any_tensor(rank: int, port: int, results: Path) -> None:
    _join(rank, 2, port)
    transport = SharedMemoryCollectives(rank=rank, world_size=2, timeout_s=30, field=FIELD)
    counts = torch.arange(6, dtype=torch.int64).reshape(2, 3) * (rank + 1)
    transport.sum_(counts)
    columns = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (rank + 1)  # strided
    transport.sum_(columns)
    try:
        transport.sum_(torch.ones(3 + rank))
        refusal = "accepted"
    except ToolkitError as error:
        refusal = str(error)
    try:  # the same bytes, another collective: ranks that issued theirs in different orders
        if rank == 0:
            transport.sum_(torch.ones(4))
        else:
            transport.all_gather_into_(torch.empty(8), torch.ones(4))
        out_of_order = "accepted"
    except ToolkitError as error:
        out_of_order = str(error)
    try:  # a reduce to different roots: ranks that disagree on the partition's owner
        transport.reduce_to_(torch.ones(4), root=rank)
        other_root = "accepted"
    except ToolkitError as error:
        other_root = str(error)
    report = {
        "other_root": other_root,
        "counts": counts.tolist(),
        "columns": columns.tolist(),
        "refusal": refusal,
        "out_of_order": out_of_order,
    }
    (results / f"rank{rank}.txt").write_text(json.dumps(report))
    dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only")
def test_sums_of_integer_and_strided_tensors_and_mismatched_calls(tmp_path: Path) -> None:
    mp.spawn(_sums_of_any_tensor, args=(free_port(), tmp_path), nprocs=2)
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.txt").read_text())
        assert report["counts"] == (torch.arange(6).reshape(2, 3) * 3).tolist()
        assert report["columns"] == (torch.arange(12.0).reshape(3, 4).t() * 3).tolist()
        assert "tensors of different sizes" in report["refusal"], report["refusal"]
        assert "[12, 16]" in report["refusal"]
        assert "called different collectives" in report["out_of_order"], report["out_of_order"]
        assert "['sum', 'all-gather']" in report["out_of_order"]
        assert "['reduce to rank 0', 'reduce to rank 1']" in report["other_root"]
